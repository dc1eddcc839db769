"""Who is calling: the signed-in user, an API key, a tenant, and the proxy-aware client IP.

Everything here treats request data as hostile: header values are length-checked, addresses
parsed with ``ipaddress``, and nothing read from a request is used as a Redis key without
``keys.scope_token`` hashing it.
"""

import functools
import hashlib
import ipaddress
import logging
from typing import NamedTuple

from django.utils.module_loading import import_string

from ..conf import get_config, meta_key
from .keys import scope_token
from .scopes import Scope, hash_api_key

__all__ = ["Identity", "identify", "client_ip", "client_address", "limited_ip", "reset",
           "is_trusted_proxy", "untrusted_forwarder"]

logger = logging.getLogger("ratelimit_app")

# Longer header values are not API keys; they are ignored (and never hashed at length).
MAX_API_KEY_LENGTH = 200
# Only the last hops of X-Forwarded-For can have been added by our own proxies.
MAX_FORWARDED_HOPS = 20
# The longest textual IP address ("ffff:...:255.255.255.255" is 45) with room for a zone id.
MAX_ADDRESS_LENGTH = 64
# A hop may add brackets, quotes and a port (":65535", or RFC 7239's obfuscated "_name").
MAX_HOP_LENGTH = MAX_ADDRESS_LENGTH + 24
# Longer tenant names (from a TENANT_RESOLVER, possibly request input) are kept as their digest,
# so an identity, and every per-process memo keyed by one, stays small.
MAX_TENANT_LENGTH = 100


class Identity(NamedTuple):
    """The caller of one request. ``display`` is safe to show staff (never a secret).

    (A NamedTuple rather than a dataclass: one is built per request.)
    """

    kind: str                 # "key", "user" or "anonymous"
    display: str              # user name, "key rk_ab12…" or the client IP
    ip: str                   # client address (IPv6: its network)
    plan: str | None
    tenant: str | None = None
    user_id: str | None = None
    api_key_id: int | None = None
    # never banned nor locked out by failed authentications: an allow-list entry matches the
    # caller (protection/lists.py), or its address stands for a trusted proxy, not for one
    # client (client_address: the proxy's own, or the clients it forwarded as "unknown")
    trusted: bool = False

    @property
    def client_token(self):
        """Key-safe token of the user/key scope, or None for anonymous callers."""
        if self.kind == "key":
            return scope_token("key", self.api_key_id)
        if self.kind == "user":
            return scope_token("user", self.user_id)
        return None

    @property
    def ref(self):
        """What finds this caller again (hot-key rows, the inspector): ``key:<id>``,
        ``user:<id>`` or ``ip:<address>``."""
        if self.kind == "key":
            return f"key:{self.api_key_id}"
        if self.kind == "user":
            return f"user:{self.user_id}"
        return f"ip:{self.ip}"

    @property
    def primary_token(self):
        """The most specific token of this caller (its key, user or IP)."""
        return self.client_token or scope_token("ip", self.ip)

    def token_for(self, scope):
        """Return the key-safe scope value of a rule scope for this caller, None if N/A."""
        if scope == Scope.USER:
            return self.client_token
        if scope == Scope.IP:
            return scope_token("ip", self.ip)
        if scope == Scope.TENANT:
            return scope_token("tenant", self.tenant) if self.tenant else None
        if scope == Scope.PLAN:
            return scope_token("plan", self.plan)
        return "global"


def reset(**kwargs):
    """Forget parsed settings (a ``setting_changed`` receiver: RATELIMIT_APP changed)."""
    if kwargs.get("setting") not in (None, "RATELIMIT_APP"):
        return
    for cached in (_trusted_networks, _resolver, _is_trusted, _as_limited, _parse_address,
                   _direct_client):
        cached.cache_clear()


@functools.cache
def _trusted_networks():
    return tuple(ipaddress.ip_network(p, strict=False) for p in get_config()["TRUSTED_PROXIES"])


@functools.cache
def _resolver(name):
    path = get_config()[name]
    return import_string(path) if path else None


def _parse_ip(text):
    # Only short texts reach the cache: its keys are request input, and a bounded number of
    # unbounded strings is still unbounded memory (random 4 kB X-Forwarded-For hops once grew
    # it to half a gigabyte per worker).
    text = text.strip()
    if len(text) > MAX_ADDRESS_LENGTH:
        return None
    return _parse_address(text)


@functools.lru_cache(maxsize=65536)  # bounded; the same addresses come back request after request
def _parse_address(text):
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if address.version == 6 and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


@functools.lru_cache(maxsize=65536)
def _is_trusted(address):
    return any(address in network for network in _trusted_networks())


def client_ip(meta):
    """Return the client address of a request's ``meta`` as ``Identity.ip`` holds it (see
    ``client_address``)."""
    return client_address(meta)[0]


def client_address(meta):
    """Return ``(ip, for_proxy)``: the client address of a request's ``meta`` and whether it
    stands for a trusted proxy rather than one client.

    ``ip`` is REMOTE_ADDR or, when that is a trusted proxy, the nearest X-Forwarded-For hop
    that is not one of our proxies (IPv6 addresses become their network). A hop may be an
    RFC 7239 node (a port, brackets, quotes). A hop that names no address was written by the
    proxy to its right (``writer``), which is trusted: it gets a name of its own under that
    proxy (``_unnamed_client``), never the proxy's address. ``for_proxy`` is True for the
    proxy's own address (no header, or every hop one of our proxies) and for the clients a
    proxy forwarded as ``unknown``: many callers, so never banned (Identity.trusted)."""
    remote = (meta.get("REMOTE_ADDR") or "").strip()
    if len(remote) <= MAX_ADDRESS_LENGTH:
        # the common case in one cached call on the text (no ipaddress object hashed twice:
        # about 0.7 µs per request); short texts only, as in _parse_ip
        direct = _direct_client(remote)
        if direct is not None:
            return direct
    address = _parse_ip(remote)
    if address is None:
        return _UNKNOWN_REMOTE
    # REMOTE_ADDR is a trusted proxy: the client is in the hops it and our other proxies added
    for hop in _last_hops(meta.get("HTTP_X_FORWARDED_FOR") or ""):
        hop_address = _parse_ip(hop)
        if hop_address is None:
            hop_address = _parse_node(hop)
        if hop_address is None:
            return _unnamed_client(hop, writer=address)
        address = hop_address
        if not _is_trusted(hop_address):
            return _as_limited(address), False
    return _as_limited(address), True  # the proxy itself, or every hop one of our proxies


# REMOTE_ADDR missing or not an address (a unix socket without a proxy in front)
_UNKNOWN_REMOTE = ("unknown", False)


def _last_hops(header):
    """Yield the last MAX_FORWARDED_HOPS hops of an X-Forwarded-For value, nearest first. Only
    those are split off (``rsplit``'s bound): a header of a million commas costs no more. No
    header (or an empty one) yields nothing."""
    if not header:
        return ()
    hops = header.rsplit(",", MAX_FORWARDED_HOPS)
    if len(hops) > MAX_FORWARDED_HOPS:
        del hops[0]  # whatever lies beyond the last hops, unsplit
    return reversed(hops)


def _parse_node(hop):
    """Return the address of a hop written as an RFC 7239 node (``1.2.3.4:5555``,
    ``[2001:db8::1]``, ``[2001:db8::1]:443``, optionally quoted: ``"198.51.100.5"``), or None.

    A port is dropped: it tells apart connections, not clients. ``unknown`` and obfuscated
    names (``_hidden``) name no address: None here too (``_unnamed_client`` names them).
    """
    text = _unquoted(hop)
    if len(text) > MAX_HOP_LENGTH:
        return None
    if text.startswith("["):
        host, bracket, port = text[1:].partition("]")
        if not bracket or host.count(":") < 2:  # brackets hold an IPv6 address only
            return None
        if port and not (port[0] == ":" and _valid_port(port[1:])):
            return None
        return _parse_ip(host)
    address = _parse_ip(text)  # quoted, without a port
    if address is not None:
        return address
    # one colon: an IPv4 address and its port (an IPv6 address, which has several, was
    # parsed already if it is one)
    host, colon, port = text.partition(":")
    if not colon or "." not in host or not _valid_port(port):
        return None
    return _parse_ip(host)


def _unquoted(hop):
    text = hop.strip()
    if len(text) > 1 and text[0] == text[-1] == '"':
        text = text[1:-1].strip()
    return text


def _valid_port(port):
    # RFC 7239: a port number (1 to 5 digits), or an obfuscated port ("_" then letters,
    # digits, ".", "_", "-")
    if port.isdigit():
        return port.isascii() and len(port) <= 5
    return _obfuscated(port)


def _obfuscated(text):
    """True if ``text`` is an RFC 7239 obfuscated identifier (``_hidden``, ``_p.1-x``)."""
    return len(text) > 1 and text[0] == "_" and text.isascii() and \
        text[1:].replace(".", "").replace("_", "").replace("-", "").isalnum()


# The longest obfuscated identifier kept as written in Identity.ip (longer ones are hashed).
MAX_OBFUSCATED_LENGTH = 32


def _unnamed_client(hop, writer):
    """Return ``(ip, for_proxy)`` of a client that a trusted proxy (``writer``, the address
    that wrote the hop) forwarded without an address: ``hop`` is ``unknown``, an obfuscated
    identifier, or not a node at all. Each gets an ``Identity.ip`` of its own under that proxy,
    never the proxy's own address (which it would share with every such client, and its bans):

    - ``unknown via 10.0.0.1``: the proxy did not know the client (RFC 7239). The clients it
      forwards so cannot be told apart: one bucket, never banned (``for_proxy``).
    - ``_hidden via 10.0.0.1``: an obfuscated identifier, stable per client (RFC 7239): the
      client's own bucket.
    - ``hop-<digest> via 10.0.0.1``: anything else (a broken header), by a digest of its first
      MAX_HOP_LENGTH characters, so the name stays short whatever was sent.

    A port after the name is dropped, as for an address. Only proxies write these hops (a
    client's own entries lie left of the hop its proxy added), and every name is a Redis key
    only through ``scope_token``'s hash, with a TTL, as an IPv6 client's network is.
    """
    text = _unquoted(hop)[:MAX_HOP_LENGTH]
    name = text.rpartition(":")[0] if ":" in text and not text.startswith("[") else text
    if not name or name.lower() == "unknown":
        return f"unknown via {writer}", True
    if len(name) <= MAX_OBFUSCATED_LENGTH and _obfuscated(name):
        return f"{name} via {writer}", False
    logger.info("ratelimit_app: an X-Forwarded-For hop that is not an RFC 7239 node")
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return f"hop-{digest} via {writer}", False


@functools.lru_cache(maxsize=65536)
def _direct_client(text):
    """Return client_address's answer for a REMOTE_ADDR ``text`` that is not a trusted proxy,
    or None when it is one (X-Forwarded-For must be read)."""
    address = _parse_address(text)
    if address is None:
        return _UNKNOWN_REMOTE
    return None if _is_trusted(address) else (_as_limited(address), False)


def untrusted_forwarder(meta):
    """Return REMOTE_ADDR (as text) when the request carries X-Forwarded-For but REMOTE_ADDR is
    not a trusted proxy (so the header is ignored), else None."""
    if not meta.get("HTTP_X_FORWARDED_FOR"):
        return None
    address = _parse_ip(meta.get("REMOTE_ADDR") or "")
    if address is None or _is_trusted(address):
        return None
    return str(address)


def is_trusted_proxy(text):
    """True if the address ``text`` is in TRUSTED_PROXIES."""
    address = _parse_ip(text or "")
    return address is not None and _is_trusted(address)


def limited_ip(text):
    """Return the address ``text`` as ``Identity.ip`` holds it (IPv6: its network), or None if
    ``text`` is not an address. Used to match per-IP overrides."""
    address = _parse_ip(text or "")
    return None if address is None else _as_limited(address)


@functools.lru_cache(maxsize=65536)
def _as_limited(address):
    if address.version == 6:
        prefix = get_config()["IPV6_PREFIX_LENGTH"]
        return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))
    return str(address)


def _api_key(meta, snapshot):
    header = get_config()["API_KEY_HEADER"]
    if not header:
        return None
    raw = meta.get(meta_key(header))
    if not raw or len(raw) > MAX_API_KEY_LENGTH:
        return None
    try:
        digest = hash_api_key(raw)
    except UnicodeEncodeError:  # a lone surrogate (test clients, odd servers): not a key we issued
        return None
    return snapshot.api_keys.get(digest)


_new_identity = tuple.__new__


def plan_of(key, assignment, snapshot):
    """Return the plan of a signed-in caller (before PLAN_RESOLVER): its API key's own
    (``key``, an ApiKeyEntry or None), else its user's assignment's (``assignment``, a
    ``(plan, tenant)`` or None), else the default plan for signed-in callers."""
    return (key.plan if key else None) or (assignment[0] if assignment else None) \
        or snapshot.default_authenticated_plan


def identify(request, user, snapshot):
    """Return the Identity of ``request`` (``user`` is the authenticated user or None)."""
    meta = request.META
    ip, for_proxy = client_address(meta)
    key = _api_key(meta, snapshot)
    user_id = None
    if user is not None and getattr(user, "is_authenticated", False):
        user_id = str(user.pk)
    if key is not None:
        kind, display, user_id = "key", f"key {key.prefix}…", key.user_id
    elif user_id is not None:
        kind, display = "user", user.get_username()[:150]
    else:
        kind, display = "anonymous", ip

    assignment = snapshot.assignments.get(user_id) if user_id else None
    tenant_resolver = _resolver("TENANT_RESOLVER")
    if tenant_resolver is not None:
        tenant = tenant_resolver(request)
        if tenant and len(tenant) > MAX_TENANT_LENGTH:
            tenant = scope_token("tenant", tenant)
    else:
        tenant = (key.tenant if key else "") or (assignment[1] if assignment else "")
    if kind == "anonymous":
        plan = snapshot.default_anonymous_plan
    else:
        plan = plan_of(key, assignment, snapshot)
    # positionally, without the NamedTuple's keyword-handling __new__ (one per request)
    identity = _new_identity(Identity, (kind, display, ip, plan, tenant or None, user_id,
                                        key.id if key else None, for_proxy))
    plan_resolver = _resolver("PLAN_RESOLVER")
    if plan_resolver is not None:
        resolved = plan_resolver(request, identity)
        if resolved in snapshot.plans:
            identity = identity._replace(plan=resolved)
        elif resolved:
            # a slug that names no plan matches no plan's rules; as a plan-scope bucket token it
            # would let request input mint new shared buckets
            logger.info("ratelimit_app: PLAN_RESOLVER gave unknown plan %.40r; ignored", resolved)
    return identity
