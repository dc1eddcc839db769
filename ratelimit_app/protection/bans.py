"""The penalty box: a caller that triggers too many events is banned for a while.

A ban rule (``config.models.BanRule``) counts events of one kind per caller (its IP, user or API
key, or tenant): refusals by the quotas, responses whose status is in a set, or failed
authentications. The ``threshold``-th event within ``window_s`` bans the caller for ``ban_s``;
each ban within ``memory_s`` of the previous one lasts ``factor`` times longer, up to
``max_ban_s`` (fail2ban's ``bantime.increment``). Requests during a ban do not extend it unless
the rule says so.

Where the state lives, and why it costs nothing extra:

- A ban is a record in the caller's own key (``rl:{ip.…}``, beside its buckets), which the
  decision's take.lua call reads anyway: the engine plans it as a gate (checked, never debited)
  of capacity 1000 units refilling 1 unit per ms, and ``ban.lua`` writes it emptied to
  ``1000 - D``, so it refuses for exactly D ms. One round trip, the caller's Cluster slot, and a
  refused request debits nothing (take.lua's all-or-nothing).
- The refusal reports the gate's level, so the worker's deny cache knows how long the ban has
  left and answers the banned caller's flood without Redis.
- Events are counted after the response, by ``ban.lua`` on the same key (one call per caller key
  with a rule whose events the response matched; none otherwise).

What one caller cannot make the penalty box do to another:

- A refusal counts towards a rule of scope S only when a bucket of the caller's own refused it:
  one at S, or at a scope nested in S (``OWN_SCOPES``). Global, plan and tenant buckets are
  drained by everyone on them, so their refusals say nothing of this caller; nor do a shadow
  bucket's would-be refusals, a list's, a ban's, or a refusal while Redis could not answer.
- A refused retry during a ban is no event: it extends the bans that refused it, of the rules
  whose retries extend them, and nothing else (ban.lua's "retry").
"""

import struct
from dataclasses import dataclass, field
from importlib import resources
from typing import NamedTuple

from ..conf import get_config
from ..decision.keys import bucket_key
from ..decision.scopes import Scope
from ..stores import StoreUnavailable

__all__ = ["BanGateRule", "CompiledBanRule", "compile_ban_rule", "BanOutcome", "PenaltyBox",
           "OWN_SCOPES", "refusing_scopes",
           "COUNTED", "BANNED", "ALREADY_BANNED", "WOULD_BAN", "LIFTED", "NOT_BANNED"]

# ban.lua's outcomes
COUNTED, BANNED, ALREADY_BANNED, WOULD_BAN, LIFTED, NOT_BANNED = range(6)
_YEAR_MS = 366 * 24 * 3600 * 1000
_BAN_SPEC = struct.Struct("<qqqqqqqq")

# The scopes whose buckets are a caller's own at a ban rule's scope, so that their refusals count
# as its abuse: the rule's scope and those nested in it. A user (or an API key, which is a caller
# of its own at user scope) belongs to its tenant, so a tenant's rule counts its members' own
# refusals too; a client address is nested in none (many users and tenants can share one, and
# one user calls from many), so it counts only for address rules. Per-endpoint buckets are
# records of their scope's caller and count with it.
OWN_SCOPES = {
    Scope.IP: frozenset({Scope.IP}),
    Scope.USER: frozenset({Scope.USER}),
    Scope.TENANT: frozenset({Scope.TENANT, Scope.USER}),
}
_NO_SCOPES = frozenset()


def refusing_scopes(decision):
    """Return the scopes of the enforced buckets that refused ``decision`` (a frozenset): empty
    when it was allowed, or refused by a ban, a list, or while Redis could not answer (none of
    its buckets refused then). A shadow bucket's would-be refusal is left out."""
    if decision is None or decision.allowed or decision.banned:
        return _NO_SCOPES
    return frozenset([s.scope for s in decision.policies if s.short and not s.shadow])


@dataclass(frozen=True, slots=True)
class BanGateRule:
    """The rule a ban's gate bucket reports under (what ``decision.buckets.Bucket`` reads of a
    rule): one token a second, capacity one, so its level counts the ban's milliseconds left.
    ``id`` is the gate record's (negative: apart from the quota rules' ids in the same key)."""

    id: int
    name: str
    scope: str
    plan: str | None = None
    endpoint: str = ""
    rate: int = 1
    period_s: int = 1
    burst: int = 1
    shadow: bool = False
    fail_open: bool = True
    failed_auth: bool = False
    lease: int = 0
    calendar: str = ""
    concurrency: bool = False
    alerts: tuple = ()
    debt: int = 0
    credits: bool = False
    refill: str = ""
    ban: bool = True

    def lets_through_without_redis(self):
        """A ban cannot be checked while Redis cannot answer: the request goes on."""
        return True


@dataclass(frozen=True, slots=True)
class CompiledBanRule:
    """A ban rule as the request path reads it."""

    id: int
    name: str
    scope: str
    events: str            # "refusals", "statuses" or "failed_auth"
    statuses: frozenset
    path_prefix: str
    shadow: bool
    extend_on_retry: bool
    gate_rule: BanGateRule
    spec: bytes = field(repr=False)  # ban.lua's argument
    ban_s: int = 0
    # the scopes of the buckets whose refusals are this rule's events (OWN_SCOPES)
    own_scopes: frozenset = _NO_SCOPES

    def counts(self, path, status, refused_scopes, failed_auth):
        """True if a response (its ``path``, ``status``, the scopes of the buckets that refused
        it, ``refusing_scopes``, and whether its credentials failed) is one of this rule's
        events. A refusal is one only when a bucket of the caller's own refused it."""
        if self.path_prefix and not _under(path, self.path_prefix):
            return False
        if self.events == "statuses":
            return status in self.statuses
        if self.events == "refusals":
            return not self.own_scopes.isdisjoint(refused_scopes)
        return failed_auth


def _under(path, prefix):
    """True if ``path`` is ``prefix`` or below it, segment by segment (``/login`` covers
    ``/login/`` and ``/login/x``, not ``/loginx``)."""
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or not prefix


def gate_record_id(ban_rule_id):
    """Return the record id of rule ``ban_rule_id``'s ban (its events and history follow)."""
    return -3 * ban_rule_id


def compile_ban_rule(row, statuses):
    """Return the CompiledBanRule of a BanRule row (a named tuple of its fields)."""
    shadow = row.mode == "shadow"
    gate_id = gate_record_id(row.id)
    longest_ms = row.max_ban_s * 1000 if row.max_ban_s else _YEAR_MS
    flags = (1 if shadow else 0) | (2 if row.extend_on_retry else 0)
    spec = _BAN_SPEC.pack(gate_id, row.threshold, row.window_s * 1000, row.ban_s * 1000,
                          row.factor, longest_ms, row.memory_s * 1000, flags)
    return CompiledBanRule(
        id=row.id, name=row.name, scope=row.scope, events=row.events,
        statuses=frozenset(statuses), path_prefix=row.path_prefix, shadow=shadow,
        extend_on_retry=row.extend_on_retry,
        gate_rule=BanGateRule(id=gate_id, name=row.name, scope=row.scope), spec=spec,
        ban_s=row.ban_s, own_scopes=OWN_SCOPES.get(row.scope, frozenset({row.scope})))


class BanOutcome(NamedTuple):
    """What ban.lua did for one rule and one caller: ``outcome`` (BANNED, WOULD_BAN, …), the
    ban's end (``until_ms``, on the script's clock) and the bans within the rule's memory
    (``times``)."""

    rule: CompiledBanRule
    identity: object
    key: str
    outcome: int
    until_ms: int
    times: int
    at_ms: int   # when ban.lua ran (the ban's start, for a new one)


class PenaltyBox:
    """Count events towards bans and lift bans, for a Limiter. ``guarded`` runs a store call
    through the Limiter's circuit breaker; ``now_ms`` gives a test clock's time (None: the
    Redis clock)."""

    def __init__(self, store, *, guarded, now_ms):
        self._store = store
        self._guarded = guarded
        self._now_ms = now_ms
        self._script = None

    def events_of(self, snapshot, identity, path, status, refused_scopes, failed_auth, banned):
        """Return ``{key: [rules]}``: the ban rules a response's events count towards, by the
        caller key they are counted in (``refused_scopes``: ``refusing_scopes`` of its
        decision). A request refused by bans (``banned``: the names of their rules) is a retry,
        no event: only those of its bans whose rule says retries extend them are returned
        (``count(..., retry=True)`` then extends them)."""
        found = {}
        prefix = get_config()["KEY_PREFIX"]
        for rule in snapshot.ban_rules:
            if banned:
                if not (rule.extend_on_retry and rule.name in banned):
                    continue
            elif not rule.counts(path, status, refused_scopes, failed_auth):
                continue
            token = identity.token_for(rule.scope)
            if token is None:
                continue
            found.setdefault(bucket_key(prefix, token), []).append(rule)
        return found

    def count(self, identity, found, *, retry=False):
        """Count one event for each of ``found``'s rules (``events_of``); return the
        BanOutcomes. ``retry``: the request was refused by these bans; extend those still in
        force (ALREADY_BANNED) and count nothing (NOT_BANNED for a ban that ended or was
        lifted meanwhile). Raises StoreUnavailable."""
        outcomes = []
        for key, rules in found.items():
            reply = self._run(key, "retry" if retry else "count", rules)
            outcomes.extend(BanOutcome(rule, identity, key, *map(int, result))
                            for rule, result in zip(rules, reply))
        return outcomes

    def lift(self, key, rules):
        """End the bans of ``rules`` (CompiledBanRules) in caller key ``key`` now; return the
        BanOutcomes (LIFTED, or NOT_BANNED). Raises StoreUnavailable."""
        reply = self._run(key, "lift", rules)
        return [BanOutcome(rule, None, key, *map(int, result))
                for rule, result in zip(rules, reply)]

    def _run(self, key, action, rules):
        now_ms = self._now_ms()
        args = ["" if now_ms is None else int(now_ms), action, *[rule.spec for rule in rules]]
        return self._guarded(self._call, key, args)

    def _call(self, key, args):
        from redis.exceptions import RedisError

        try:
            if self._script is None:
                source = resources.files("ratelimit_app.stores").joinpath("lua/ban.lua")
                self._script = self._store.metrics_client().register_script(
                    source.read_text())
            return self._script(keys=[key], args=args)
        except RedisError as error:
            raise StoreUnavailable(f"ban.lua: {error}") from error
