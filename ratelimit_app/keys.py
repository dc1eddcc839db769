"""Redis key names: ``<prefix>:{<tag>}:<rule id>:<scope value>``.

Values that come from a request (IPs, API keys, user names, tenant names) never enter a key raw:
they are hashed to a fixed-length token, so a client cannot inject ``{``, ``}`` or ``:`` (which
would move its buckets to another Cluster slot or collide with other keys) or grow keys without
bound. The ``{tag}`` hash tag is the scope value itself, so every bucket of one identity lives in
one Cluster slot.
"""

import functools
import hashlib

__all__ = ["scope_token", "bucket_key", "config_version_key", "metrics_key"]

# 16 bytes of BLAKE2b: collisions are out of reach and the key stays short.
_DIGEST_BYTES = 16


def scope_token(kind, value):
    """Return a key-safe token for a scope value, e.g. ``ip.3f9a…`` for ``("ip", "1.2.3.4")``.

    ``kind`` is one of the app's own constants; ``value`` may be anything a client sent.
    Memoised (bounded in entries and, since long values are not kept, in bytes): the same
    callers come back request after request.
    """
    if isinstance(value, (str, bytes)) and len(value) > _MAX_MEMOISED_VALUE:
        return _digest_token(kind, value)
    return _memoised_token(kind, value)


# Values longer than this are hashed on every call instead of memoised.
_MAX_MEMOISED_VALUE = 100


@functools.lru_cache(maxsize=65536)
def _memoised_token(kind, value):
    return _digest_token(kind, value)


def _digest_token(kind, value):
    if value is None or value == "":
        return kind
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    return f"{kind}.{hashlib.blake2b(raw, digest_size=_DIGEST_BYTES).hexdigest()}"


def bucket_key(prefix, rule_id, token):
    """Return the bucket key of one rule for one scope token."""
    return f"{prefix}:{{{token}}}:{rule_id}:{token}"


def config_version_key(prefix):
    """Return the key of the config version counter bumped on every admin change."""
    return f"{prefix}:config:version"


def metrics_key(prefix, *parts):
    """Return a metrics key. Metrics never share a hash tag with buckets."""
    return ":".join((prefix, "m") + tuple(str(p) for p in parts))
