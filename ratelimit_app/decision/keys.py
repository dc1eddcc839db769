"""Redis key names: ``<prefix>:{<scope token>}``, one key per identity (scope value).

Values that come from a request (IPs, API keys, user names, tenant names) never enter a key raw:
they are hashed to a fixed-length token, so a client cannot inject ``{``, ``}`` or ``:`` (which
would move its buckets to another Cluster slot or collide with other keys) or grow keys without
bound. The key is the ``{tag}`` hash tag of the scope value itself and holds every bucket of that
identity (one record per rule, see ``stores/lua/take.lua``), so one identity is one key in one
Cluster slot, and a short key: Redis spends per key about as much as on the buckets in it.
"""

import base64
import functools
import hashlib

__all__ = ["scope_token", "bucket_key", "proof_key", "config_version_key", "metrics_key"]

# 16 bytes of BLAKE2b: collisions are out of reach and the key stays short.
_DIGEST_BYTES = 16


def scope_token(kind, value):
    """Return a key-safe token for a scope value, e.g. ``ip.P5qR…`` (22 characters of URL-safe
    base64) for ``("ip", "1.2.3.4")``.

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
    digest = hashlib.blake2b(raw, digest_size=_DIGEST_BYTES).digest()
    # URL-safe base64 (letters, digits, "-", "_"): 22 characters where hex needs 32
    return f"{kind}.{base64.urlsafe_b64encode(digest).rstrip(b'=').decode()}"


def bucket_key(prefix, token):
    """Return the key holding every bucket of one scope token (each rule's bucket is a record
    in it)."""
    return f"{prefix}:{{{token}}}"


def proof_key(prefix, address_token, credential_token):
    """Return the key of a credential's proof from a client address: in the address's slot
    (its ``{tag}``), named by both tokens (each a fixed-length digest)."""
    return f"{prefix}:{{{address_token}}}:p.{credential_token}"


def config_version_key(prefix):
    """Return the key of the config version counter bumped on every admin change."""
    return f"{prefix}:config:version"


def config_changes_key(prefix):
    """Return the key of the record of which tables each recent config version changed."""
    return f"{prefix}:config:changes"


def metrics_key(prefix, *parts):
    """Return a metrics key. Metrics never share a hash tag with buckets."""
    return ":".join((prefix, "m") + tuple(str(p) for p in parts))
