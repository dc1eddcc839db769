"""Allow and deny lists: callers refused outright, and callers trusted.

An entry names callers by one of five things (``TARGETS``): their client IP or network (IPv4 or
IPv6, an address or a CIDR range), their API key, their user (which covers the user's keys),
their tenant, or a part of their User-Agent (case-insensitive). A deny entry refuses them
before any bucket is read (403, its own problem type naming the entry's reason, never what it
matched); an allow entry marks them trusted (``Identity.trusted``: the penalty box never bans
them) and, with ``exempt``, spares them the quotas as well. A deny entry wins over an allow
entry: an operator's explicit refusal is the stronger statement. An entry may start and end
at given moments, as a dated override does.

The entries in force are compiled into the policy snapshot (``AccessLists``), so a listed
caller costs no database query and no Redis call. Matching is a few dictionary lookups: by key
id, user id and tenant, and for addresses one lookup per distinct prefix length among the
entries (the caller's address as an integer shifted to that length, looked up in a set of the
entries' networks), remembered per address in a memo that starts afresh when full, so memory
stays bounded however many addresses call. Only the User-Agent entries are scanned, one
substring search each.

IPv6 callers are told apart by their network of ``IPV6_PREFIX_LENGTH`` bits (``identity.py``:
one /64 is one caller, as for the quotas and the overrides), so an IPv6 entry cannot be
narrower than that: the admin refuses one, and an entry left narrower by a later change of the
setting applies to its whole network.
"""

import ipaddress
import logging
import math
from dataclasses import dataclass
from typing import NamedTuple

from ..decision import engine
from ..decision.engine import Decision

__all__ = ["TARGETS", "ListEntry", "AccessLists", "Screening", "ListValueError",
           "normalized_value", "everyone_wide_warning", "screen", "is_trusted",
           "MIN_USER_AGENT_LENGTH"]

logger = logging.getLogger("ratelimit_app")

# What an entry can match, as ``AccessListEntry.target`` stores it.
IP, API_KEY, USER, TENANT, USER_AGENT = "ip", "api_key", "user", "tenant", "user_agent"
TARGETS = (IP, API_KEY, USER, TENANT, USER_AGENT)

# A shorter part of a User-Agent matches nearly every browser.
MIN_USER_AGENT_LENGTH = 3
# Tenants longer than this are known to the request path by their digest (identity.py).
MAX_TENANT_LENGTH = 100
# Addresses whose matching entries one AccessLists remembers (then it starts afresh).
MAX_ADDRESSES_MEMOISED = 4096


class ListValueError(ValueError):
    """A list entry's value that cannot be matched; the message says what to write instead."""


def _network(text, ipv6_prefix):
    """Return the network ``text`` names (an address is its /32 or /128; an IPv4-mapped IPv6
    address its IPv4 address), or raise ListValueError."""
    text = text.strip()
    try:
        ipaddress.ip_network(text, strict=True)
    except ValueError:
        try:
            loose = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ListValueError(
                f"“{text}” is not an IP address or network: write an address (203.0.113.7) "
                f"or a CIDR range (203.0.113.0/24, 2001:db8::/48).") from None
        raise ListValueError(
            f"“{text}” is not a network: its address has bits set beyond the first "
            f"{loose.prefixlen}. The network is {loose}: write that, or the address alone.") \
            from None
    network = _compiled_network(text, 128)  # (an IPv4-mapped address: its IPv4 address)
    if network.version == 6 and network.prefixlen > ipv6_prefix:
        wider = network.supernet(new_prefix=ipv6_prefix)
        raise ListValueError(
            f"IPv6 callers are told apart by their /{ipv6_prefix} network "
            f"(IPV6_PREFIX_LENGTH), so an entry for {text} would apply to all of {wider}: "
            f"write {wider}.")
    return network


def normalized_value(target, value, ipv6_prefix):
    """Return the text an entry of ``target`` stores for ``value`` (an address or a network
    in its canonical form, the words stripped), or raise ListValueError saying what is wrong.
    API key and user entries name their row instead: their value must be empty."""
    value = (value or "").strip()
    if target in (API_KEY, USER):
        if value:
            raise ListValueError("An API key or user entry names its key or user: leave the "
                                 "value empty.")
        return ""
    if not value:
        raise ListValueError("Give the value to match.")
    if target == IP:
        network = _network(value, ipv6_prefix)
        return str(network.network_address) if network.prefixlen == network.max_prefixlen \
            else str(network)
    if target == TENANT and len(value) > MAX_TENANT_LENGTH:
        raise ListValueError(f"A tenant is at most {MAX_TENANT_LENGTH} characters long.")
    if target == USER_AGENT and len(value) < MIN_USER_AGENT_LENGTH:
        raise ListValueError(f"Give at least {MIN_USER_AGENT_LENGTH} characters of the "
                             f"User-Agent: a shorter part matches nearly every browser.")
    return value


def everyone_wide_warning(deny, exempt, target, value):
    """Return the warning for an entry whose network is a whole address family (``0.0.0.0/0``,
    ``::/0``, or what normalises to one, such as ``::ffff:0:0/96``) when it refuses everyone
    of it (``deny``) or spares them every quota (an allow entry with ``exempt``); None for any
    other entry. The admin asks for a confirmation and the import for a flag before saving
    one: a typo there takes the whole API down, or off its limits."""
    if target != IP or not (deny or exempt):
        return None
    try:
        network = _compiled_network(value or "", 128)
    except ListValueError:
        return None
    if network.prefixlen:
        return None
    callers = f"every IPv{network.version} caller"
    if deny:
        return f"A deny entry for {network} refuses {callers}: the API answers them all 403."
    return (f"An allow entry for {network} exempt from quotas spares {callers} every limit "
            f"and ban.")


@dataclass(frozen=True, slots=True)
class ListEntry:
    """An entry in force, as the request path reads it. ``matched`` says what it matches for
    staff (the simulator); a client only ever reads ``reason``."""

    id: int
    deny: bool
    target: str
    matched: str
    reason: str
    exempt: bool = False       # an allow entry's callers skip the quotas too
    ends_at_s: float = math.inf  # when it stops (epoch s)


def _deny_first(entry):
    return not entry.deny, entry.id


def _grouped(pairs):
    """Return ``{key: entries}`` of ``(key, entry)`` pairs, each tuple deny entries first."""
    grouped = {}
    for key, entry in pairs:
        grouped.setdefault(key, []).append(entry)
    return {key: tuple(sorted(entries, key=_deny_first)) for key, entries in grouped.items()}


class AccessLists:
    """The list entries in force of one snapshot, indexed for matching (see the module's
    docstring). Built by ``from_rows``; immutable but for its memo of addresses."""

    def __init__(self, keys, users, tenants, networks, agents):
        self.keys = keys          # API key id -> entries
        self.users = users        # str(user id) -> entries
        self.tenants = tenants    # tenant -> entries
        # version (4, 6) -> ((prefix length, {network as int >> host bits: entries}), ...)
        self.networks = networks
        self.agents = agents      # ((casefolded part of a User-Agent, entries), ...)
        self.has_networks = bool(networks[4] or networks[6])
        self._addresses = {}      # Identity.ip -> the entries of the networks holding it

    def _indexes(self):
        return self.keys, self.users, self.tenants, self.networks, self.agents

    def __eq__(self, other):
        # (two compiles of the same rows are equal: what the tests of the compile compare)
        return isinstance(other, AccessLists) and self._indexes() == other._indexes()

    __hash__ = None

    @classmethod
    def from_rows(cls, rows, ipv6_prefix):
        """Return the AccessLists of ``rows`` (the entries in force: ``id``, ``kind``,
        ``target``, ``value``, ``user_id``, ``api_key_id``, ``exempt``, ``reason``,
        ``ends_at``), or None when there are none. A row whose value cannot be matched
        (written without the admin's checks) is left out, logged."""
        by_target = {target: [] for target in TARGETS}
        for row in rows:
            deny = row.kind == "deny"
            ends_at_s = math.inf if row.ends_at is None else row.ends_at.timestamp()
            try:
                key, matched = _match_key(row, ipv6_prefix)
            except ListValueError as exc:
                logger.warning("ratelimit_app: access list entry %s ignored: %s", row.id, exc)
                continue
            entry = ListEntry(row.id, deny, row.target, matched, row.reason,
                              exempt=bool(row.exempt) and not deny, ends_at_s=ends_at_s)
            by_target[row.target].append((key, entry))
        if not any(by_target.values()):
            return None
        networks = {4: {}, 6: {}}
        for network, entry in by_target[IP]:
            host_bits = network.max_prefixlen - network.prefixlen
            networks[network.version].setdefault(network.prefixlen, []).append(
                (int(network.network_address) >> host_bits, entry))
        return cls(_grouped(by_target[API_KEY]), _grouped(by_target[USER]),
                   _grouped(by_target[TENANT]),
                   {version: tuple((length, _grouped(pairs))
                                   for length, pairs in sorted(lengths.items()))
                    for version, lengths in networks.items()},
                   tuple(_grouped((part.casefold(), entry)
                                  for part, entry in by_target[USER_AGENT]).items()))

    def match(self, identity, meta, wall_time):
        """Return the entry that decides for ``identity`` (a request's, with its ``meta``):
        the first deny entry in force that matches it, else the first allow entry, else None.
        ``wall_time()`` (epoch s) is read only when an entry matches: one whose end has
        passed no longer counts, even before the snapshot that leaves it out is in force."""
        # (tuples added only where a table has entries: a caller no entry matches, nearly
        # every one, costs a few lookups and builds nothing)
        found = ()
        if self.keys and identity.api_key_id is not None:
            found += self.keys.get(identity.api_key_id, ())
        if self.users and identity.user_id is not None:
            found += self.users.get(identity.user_id, ())
        if self.tenants and identity.tenant:
            found += self.tenants.get(identity.tenant, ())
        if self.has_networks:
            held = self._addresses.get(identity.ip)
            found += self._address_entries(identity.ip) if held is None else held
        if self.agents:
            agent = meta.get("HTTP_USER_AGENT")
            if agent:
                agent = agent.casefold()
                for part, entries in self.agents:
                    if part in agent:
                        found += entries
        if not found:
            return None
        now_s = wall_time()
        allowed = None
        for entry in found:
            if entry.ends_at_s <= now_s:
                continue
            if entry.deny:
                return entry
            if allowed is None:
                allowed = entry
        return allowed

    def _address_entries(self, ip):
        """Return the entries of the networks that hold the address ``ip`` (Identity.ip: an
        IPv4 address, an IPv6 network, or "unknown"), and remember them (``match`` looks in
        the memo first)."""
        memo = self._addresses
        found = self._networks_holding(ip)
        if len(memo) >= MAX_ADDRESSES_MEMOISED:
            memo.clear()
        memo[ip] = found
        return found

    def _networks_holding(self, ip):
        try:
            network = ipaddress.ip_network(ip, strict=False)
        except ValueError:
            return ()  # "unknown": no address to match
        found = []
        value, bits = int(network.network_address), network.max_prefixlen
        for length, entries in self.networks[network.version]:
            if length <= network.prefixlen:
                found += entries.get(value >> (bits - length), ())
        return tuple(found)


def _compiled_network(text, ipv6_prefix):
    """Return the network an IP entry's stored ``text`` matches: what ``_network`` accepts,
    and what it refuses but a row may hold (written without the admin's checks, or before
    IPV6_PREFIX_LENGTH was changed): with bits set after its prefix, its network; narrower
    than an IPv6 caller, the caller's network holding it."""
    try:
        network = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise ListValueError(f"{text!r} is not an IP address or network") from None
    mapped = getattr(network.network_address, "ipv4_mapped", None)
    if mapped is not None and network.prefixlen >= 96:
        network = ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}")
    if network.version == 6 and network.prefixlen > ipv6_prefix:
        network = network.supernet(new_prefix=ipv6_prefix)
    return network


def _match_key(row, ipv6_prefix):
    """Return ``(what the index is keyed by, what staff read)`` of an entry ``row``."""
    if row.target == API_KEY:
        return row.api_key_id, f"API key #{row.api_key_id}"
    if row.target == USER:
        return str(row.user_id), f"user #{row.user_id}"
    if row.target == IP:
        network = _compiled_network(row.value, ipv6_prefix)
        return network, str(network)
    if row.target not in TARGETS:
        raise ListValueError(f"unknown target {row.target!r}")
    normalized_value(row.target, row.value, ipv6_prefix)
    return row.value.strip(), f"{row.target.replace('_', '-')} “{row.value.strip()}”"


class Screening(NamedTuple):
    """What a list entry makes of a request: the caller's ``identity`` (trusted when an allow
    entry matched), the ``entry``, and the ``decision`` when the entry decides alone (a deny;
    an allow exempt from quotas), else None (the quotas decide)."""

    identity: object
    entry: ListEntry
    decision: Decision | None


def screen(snapshot, request, identity, endpoint, wall_time):
    """Return the Screening of ``request`` by ``snapshot.access_lists``, or None when no entry
    matches it (the caller is then decided as if there were no lists)."""
    entry = snapshot.access_lists.match(identity, request.META, wall_time)
    if entry is None:
        return None
    if entry.deny:
        retry_after = 0 if entry.ends_at_s == math.inf else \
            max(1, math.ceil(entry.ends_at_s - wall_time()))
        return Screening(identity, entry, Decision(
            allowed=False, retry_after_s=retry_after, identity=identity, endpoint=endpoint,
            listed=entry))
    identity = identity._replace(trusted=True)
    if not entry.exempt:
        return Screening(identity, entry, None)
    cost = engine.request_cost(snapshot, request, endpoint, identity.plan)
    return Screening(identity, entry, Decision(allowed=True, identity=identity,
                                               endpoint=endpoint, cost=cost, exempt=True,
                                               listed=entry))


def is_trusted(snapshot, request, identity, wall_time):
    """Return True if an allow entry in force matches the caller of ``request`` and no deny
    entry does, or when its address stands for a trusted proxy (``identity.trusted`` from
    ``identify``), for the paths no decision screens, e.g. a failed authentication's charge;
    a decided request's ``identity.trusted`` says the same."""
    lists = snapshot.access_lists
    if lists is None:
        return identity.trusted
    entry = lists.match(identity, request.META, wall_time)
    if entry is None:
        return identity.trusted
    return not entry.deny
