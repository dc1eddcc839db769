"""Stores: where the buckets live. One class per kind of Redis deployment, behind one interface.

- ``RedisStore``: one node, through a django-redis cache alias (``CACHE_ALIAS``).
- ``SentinelStore``: the same alias configured with django-redis's ``SentinelClient``.
- ``ClusterStore``: a Redis Cluster through redis-py's ``RedisCluster`` (``CLUSTER_NODES``).
"""

from .base import Store, StoreMisconfigured, StoreUnavailable, SupersededRules, TakeReply
from .redis import RedisStore, SentinelStore

__all__ = ["Store", "StoreUnavailable", "StoreMisconfigured", "SupersededRules", "TakeReply",
           "RedisStore",
           "SentinelStore", "build_store"]

SENTINEL_CLIENT = "django_redis.client.SentinelClient"


def build_store(config):
    """Return the store the settings describe: a Cluster when CLUSTER_NODES lists nodes, else
    the django-redis cache alias (Sentinel when that cache uses the SentinelClient)."""
    if config["CLUSTER_NODES"]:
        from .cluster import ClusterStore

        return ClusterStore.from_nodes(config["CLUSTER_NODES"], config["CLUSTER_OPTIONS"])
    if cache_client_class(config["CACHE_ALIAS"]) == SENTINEL_CLIENT:
        return SentinelStore.from_cache_alias(config["CACHE_ALIAS"])
    return RedisStore.from_cache_alias(config["CACHE_ALIAS"])


def cache_client_class(alias):
    """Return the django-redis CLIENT_CLASS of cache ``alias`` ("" when not set)."""
    from django.conf import settings

    return (settings.CACHES.get(alias, {}).get("OPTIONS") or {}).get("CLIENT_CLASS", "")
