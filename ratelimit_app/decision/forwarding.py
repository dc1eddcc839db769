"""Noticing X-Forwarded-For sent from an address that is not in TRUSTED_PROXIES.

Such a header is ignored (a client could forge it), which is right for a client and wrong for
a proxy someone forgot to list: then the proxy's address is every client's address, and they
all share one IP bucket and one failed-authentication count. Both look alike from here, so the
first such request of a process is logged once, and published for ``manage.py ratelimit check``
(another process) to report: the operator knows which it is.
"""

import json
import logging
import os

from redis.exceptions import RedisError

from ..stores import StoreUnavailable
from .identity import untrusted_forwarder

__all__ = ["UntrustedForwarding", "read_sighting", "untrusted_forwarding_key"]

logger = logging.getLogger("ratelimit_app")

# How long the published sighting stays for the readiness report to find.
PUBLISHED_TTL_S = 24 * 3600


def untrusted_forwarding_key(prefix):
    """Return the Redis key of the last published sighting."""
    return f"{prefix}:warning:untrusted-forwarding"


class UntrustedForwarding:
    """One process's sighting of X-Forwarded-For from an untrusted address.

    ``seen`` is None until the first such request, then ``(address, unix time)``; after it the
    request path checks nothing more (``observe`` is called only while ``seen`` is None).
    """

    def __init__(self, wall_clock):
        self.wall_clock = wall_clock
        self.seen = None
        self.published = False

    def observe(self, meta):
        """Note a request's ``meta`` if it carries X-Forwarded-For from an untrusted address
        (logged the first time only)."""
        address = untrusted_forwarder(meta)
        if address is None or self.seen is not None:
            return
        self.seen = (address, self.wall_clock())
        logger.warning(
            "ratelimit_app: a request from %s carried X-Forwarded-For, but %s is not in "
            "RATELIMIT_APP['TRUSTED_PROXIES'], so the header was ignored. If it is your proxy, "
            "every client behind it shares its address (one IP bucket): add it to "
            "TRUSTED_PROXIES. (Logged once per process.)", address, address)

    def publish(self, client_provider, prefix):
        """Write the sighting, once, where the readiness report reads it (the metrics flush
        thread calls this: off the request path); ``client_provider()`` returns the redis-py
        client. Kept for the next call if Redis fails."""
        if self.seen is None or self.published:
            return
        address, at = self.seen
        value = json.dumps({"address": address, "at": at, "pid": os.getpid()})
        try:
            client_provider().set(untrusted_forwarding_key(prefix), value, ex=PUBLISHED_TTL_S)
        except (RedisError, StoreUnavailable):
            return
        self.published = True


def read_sighting(client, prefix):
    """Return the last published sighting as a dict (address, at, pid), or None."""
    raw = client.get(untrusted_forwarding_key(prefix))
    if raw is None:
        return None
    try:
        found = json.loads(raw)
        return {"address": str(found["address"])[:64], "at": float(found["at"]),
                "pid": int(found["pid"])}
    except (ValueError, KeyError, TypeError):
        return None
