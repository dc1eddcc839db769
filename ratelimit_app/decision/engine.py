"""The decision's pure steps: what a request costs, which buckets it is charged against, and the
Decision that a store's reply means. Nothing here does I/O; ``limiter.Limiter`` runs the steps
and talks to the store.
"""

import logging
import math
import operator
import struct
from typing import NamedTuple

from ..conf import get_config, meta_key
from . import periods
from .buckets import (
    BanGate,
    Bucket,
    CalendarQuota,
    CheckedBucket,
    ConcurrencySlot,
    CreditBalance,
    CredentialProof,
    LevelStatuses,
)
from .headers import retry_after_with_jitter
from .keys import bucket_key, proof_key
from .meter import Meter, charge_without_meter
from .scopes import Scope

__all__ = ["Decision", "PlannedBuckets", "plan_buckets", "client_buckets", "response_buckets",
           "overrides_for",
           "with_override_numbers",
           "request_cost", "take_args", "settle_args", "settled_buckets", "statuses_from", "reply_statuses", "decision_from",
           "degraded_decision", "earliest_retry_s", "refusing_without_redis",
           "refusing_gate_statuses"]

logger = logging.getLogger("ratelimit_app")


class Decision(NamedTuple):
    """The outcome of one request. ``retry_after_s`` is 0 when allowed.

    (A NamedTuple rather than a dataclass: one is built per request.)
    """

    allowed: bool
    retry_after_s: int = 0
    policies: tuple = ()            # PolicyStatus per bucket, widest scope first
    violated: tuple = ()            # names of enforced policies that denied
    shadow_violations: tuple = ()   # names of shadow policies that would have denied
    identity: object = None
    endpoint: str = ""
    cost: int = 0
    degraded: str = ""              # "fail-open" / "fail-closed" when Redis could not answer
    exempt: bool = False
    from_deny_cache: bool = False
    # names of enforced policies whose capacity (burst) is below this request's cost: such a
    # request can never pass, so it is refused without a Retry-After (see headers.py)
    over_capacity: tuple = ()
    # the concurrency slot this request holds until its response is finished: (the limits'
    # sorted-set keys, the slot's member), released by Limiter.release_slot; None: no slot
    slot: tuple | None = None
    # the config version of the rules that decided (set only with EXPOSE_CONFIG_VERSION)
    config_version: str = ""
    # an allowed request to a metered endpoint: its account, settled after the response (see
    # meter.py); None for every other request
    meter: Meter | None = None
    # names of the enforced credit balances that refused: the request is answered 402, not 429
    # (see headers.problem_body)
    out_of_credits: tuple = ()
    # names of the ban rules whose ban refused the request (protection/bans.py): answered with
    # the ban's own problem type (see headers.problem_body)
    banned: tuple = ()
    # the allow- or deny-list entry that decided alone (protection/lists.py ListEntry): a
    # refusal answered 403 with its reason (see headers.problem_body), or a trusted caller
    # exempt from quotas; None for every other request
    listed: object = None

    @property
    def limited(self):
        """True if any bucket applied (and so rate-limit headers are due)."""
        return bool(self.policies)

    def charge(self, units):
        """Report that this request consumed ``units`` (a whole number ≥ 0) more: calls add up,
        and the total, at least the endpoint's minimum, is what its buckets are charged once
        the response is finished. Only for an endpoint whose cost row is metered (elsewhere a
        warning is logged and nothing changes); a bad value raises TypeError or ValueError."""
        meter = self.meter
        if meter is None:
            charge_without_meter(self, units)
        else:
            meter.add(units)


def request_cost(snapshot, request, endpoint, plan):
    """Return the tokens this request costs: the endpoint's cost, raised (never lowered) by a
    valid COST_HEADER value clamped to MAX_COST. A missing, non-numeric or non-positive header
    is ignored, so a client can declare a bigger request but never buy a cheaper one; a number
    too long to be a sensible cost is the maximum, like any other number above it."""
    cost = snapshot.cost_for(endpoint, request.method, plan)
    config = get_config()
    header = config["COST_HEADER"]
    if header:
        raw = request.META.get(meta_key(header))
        if raw is not None:
            declared = _declared_cost(raw, config["MAX_COST"])
            if declared is None:
                logger.info("ratelimit_app: ignored %s header %.40r", header, raw)
            else:
                cost = max(cost, declared)
    return cost


def _declared_cost(raw, max_cost):
    """Return the cost a header value declares, clamped to ``max_cost``, or None if it is not a
    positive whole number. Long numbers are never converted (int() of thousands of digits is
    slow and raises): anything with more digits than ``max_cost`` is above it."""
    digits = raw.strip().lstrip("0")
    if not digits or not (digits.isascii() and digits.isdigit()):
        return None
    if len(digits) > len(str(max_cost)):
        return max_cost
    return min(int(digits), max_cost)


def overrides_for(snapshot, identity):
    """Return the overrides of the snapshot that name ``identity`` (its key, user or IP)."""
    if not snapshot.overrides:
        return ()
    found = []
    for who in (("key", identity.api_key_id), ("user", identity.user_id), ("ip", identity.ip)):
        if who[1] is not None:
            found.extend(snapshot.overrides.get(who, ()))
    return found


def plan_buckets(snapshot, identity, endpoint, cost):
    """Return the buckets a request is charged against (a tuple, widest scope first), or None if
    the caller is exempt. Endpoint rules count calls (1 token); other rules are charged ``cost``.

    Memoised per snapshot: the same callers come back request after request with the same
    buckets. The memo is bounded and starts afresh when full (many one-off callers then cost
    what they would without it).
    """
    memo = snapshot.buckets_memo
    memo_key = (identity, endpoint, cost)
    found = memo.get(memo_key, _NOT_PLANNED)
    if found is _NOT_PLANNED:
        found = _build_buckets(snapshot, identity, endpoint, cost)
        if found is not None:
            found = PlannedBuckets(found, snapshot.version)
        if len(memo) >= MAX_PLANS_MEMOISED:
            memo.clear()
        memo[memo_key] = found
    return found


_NOT_PLANNED = object()
MAX_PLANS_MEMOISED = 4096


class PlannedBuckets(tuple):
    """The buckets of one (identity, endpoint, cost) as ``plan_buckets`` memoises them: a plain
    tuple of buckets that also carries what every decision on them needs, computed once rather
    than per request: ``keys`` and ``debit_args``, take.lua's arguments for a debit on the Redis
    clock fenced on the snapshot's ``version`` (None when a bucket's argument depends on the moment: a calendar quota, a concurrency
    limit; ``take_args`` builds those per call), and how the Limiter sends them: ``takes_slot``
    (one is a concurrency limit) and ``leases`` (one's rule leases tokens).

    ``plain``: every bucket is a plain token bucket or a credit balance and none is a gate
    (``_READ_FROM_LEVELS``), so an allowed reply no
    bucket was short for is read without building its statuses (``reply_statuses``); the
    headers and the metrics then keep what they read of these buckets here (``header_parts``,
    ``metric_parts``: None until first needed)."""

    def __new__(cls, buckets, version=None):
        planned = super().__new__(cls, buckets)
        planned.keys = tuple([bucket.key for bucket in buckets])
        # the config version the rules were compiled from: debits are fenced on it
        planned.version = version
        timeless = all(bucket.spec is not None for bucket in buckets)
        planned.debit_args = tuple(take_args(buckets, fence=version)) if timeless else None
        planned.takes_slot = any(isinstance(bucket, ConcurrencySlot) for bucket in buckets)
        planned.leases = any(bucket.rule.lease for bucket in buckets)
        planned.plain = all(type(bucket) in _READ_FROM_LEVELS and not bucket.gate
                            for bucket in buckets)
        planned.header_parts = planned.metric_parts = None
        return planned


# the buckets whose statuses, headers and metrics an allowed reply's levels give without
# building a status (see PlannedBuckets.plain): token buckets, and credit balances (which the
# headers leave out)
_READ_FROM_LEVELS = (Bucket, CreditBalance)


def _build_buckets(snapshot, identity, endpoint, cost):
    overrides = overrides_for(snapshot, identity)
    if any(o.exempt for o in overrides):
        return None
    config = get_config()
    prefix = config["KEY_PREFIX"]
    buckets = []
    proof = None  # the credential's proof from the address: None until a gate needs it
    for rule in snapshot.rules_for(identity.plan, endpoint):  # widest scope first
        token = identity.token_for(rule.scope)
        if token is None:
            continue  # e.g. a user rule for an anonymous caller, a tenant rule without tenant
        if overrides and rule.scope in (Scope.USER, Scope.IP):
            rule = with_override_numbers(rule, overrides)
        if rule.failed_auth:
            if identity.trusted:
                continue  # an allow-listed caller is never locked out (protection/lists.py)
            # checked, never debited here: a client IP out of failed authentications is
            # refused the credentials it has not proven from there (so a right guess teaches
            # it nothing), and a credential used from there lately passes (protection/
            # failed_auth.py says why)
            if proof is None:
                proof = _credential_proof(rule, identity, token, prefix)
                if proof is not False:
                    buckets.append(proof)
            buckets.append(Bucket(rule, bucket_key(prefix, token), 1, gate=True,
                                  proven=proof is not False))
        elif rule.counts_responses:
            # spent by the responses it counts, once they are sent (response_buckets); a
            # caller with none left is refused on its way in
            if not rule.shadow:
                buckets.append(CheckedBucket(rule, bucket_key(prefix, token)))
        elif rule.credits:
            buckets.append(CreditBalance(rule, bucket_key(prefix, token), cost, identity))
        else:
            kind = CalendarQuota if rule.calendar else \
                ConcurrencySlot if rule.concurrency else Bucket
            buckets.append(kind(rule, bucket_key(prefix, token), 1 if rule.endpoint else cost))
    for ban in () if identity.trusted else snapshot.ban_rules:  # a trusted caller: never banned
        # the ban, if any, is a record in the caller's own key: checked in this same call
        token = None if ban.shadow else identity.token_for(ban.scope)
        if token is not None:
            buckets.append(BanGate(ban.gate_rule, bucket_key(prefix, token)))
    return tuple(buckets)


def _credential_proof(rule, identity, address_token, prefix):
    """Return the CredentialProof of ``identity``'s credential (its API key or its user)
    from its address, or False for a caller without one or when proofs are off."""
    memory_s = get_config()["FAILED_AUTH_PROOF_S"]
    credential = identity.client_token
    if credential is None or not memory_s:
        return False
    return CredentialProof(rule, proof_key(prefix, address_token, credential), memory_s)


def response_buckets(snapshot, identity, endpoint, status, path):
    """Return the buckets a sent response of ``identity`` is charged one token on: those of
    the rules counting responses (``CompiledRule.counts_responses``) that apply to its plan and
    endpoint, whose statuses and path prefix it matches (a list; usually empty)."""
    prefix = get_config()["KEY_PREFIX"]
    found = []
    for rule in snapshot.response_rules:
        if rule.plan is not None and rule.plan != identity.plan:
            continue
        if rule.endpoint and rule.endpoint != endpoint:
            continue
        if rule.response_statuses and status not in rule.response_statuses:
            continue
        if rule.response_prefix and not _under(path, rule.response_prefix):
            continue
        token = identity.token_for(rule.scope)
        if token is not None:
            found.append(Bucket(rule, bucket_key(prefix, token), 1))
    return found


def _under(path, prefix):
    """True if ``path`` is ``prefix`` or below it, segment by segment."""
    prefix = prefix.rstrip("/")
    return not prefix or path == prefix or path.startswith(prefix + "/")


def client_buckets(snapshot, identity, *, ip_buckets=True):
    """Return every bucket that applies to ``identity`` on any endpoint (a list, each bucket
    once, widest scope first per endpoint), or None if the caller is exempt. ``ip_buckets=False``
    leaves out the IP-scope buckets (failed-auth gates included)."""
    endpoints = [""] + sorted({rule.endpoint for rule in snapshot.rules if rule.endpoint})
    found = {}
    for endpoint in endpoints:
        buckets = plan_buckets(snapshot, identity, endpoint, 1)
        if buckets is None:
            return None
        for bucket in buckets:
            if ip_buckets or bucket.rule.scope != Scope.IP:
                found.setdefault(bucket.id, bucket)
    return list(found.values())


def with_override_numbers(rule, overrides):
    """Return ``rule`` with the numbers of the caller's overrides that name it (or, for a rule
    counting requests, that name no rule), the last one winning: its own numbers, or the
    rule's own × its factor (never the numbers of an override before it)."""
    if rule.credits:
        return rule  # a balance, not a limit: neither numbers nor a factor change it
    own = rule
    for o in overrides:
        if o.rule_id == rule.id or (o.rule_id is None and not own.failed_auth):
            if o.factor is not None:
                rule = own.scaled(o.factor)
            elif not (own.calendar or own.concurrency):
                # (an override's own rate, period and burst describe a token bucket)
                rule = own.with_numbers(o.rate, o.period_s, o.burst)
    return rule


def take_args(buckets, now_ms=None, debit=True, slot_id=0, fence=None):
    """Return take.lua's ARGV for ``buckets``: now ("" = the Redis clock), the debit flag, then
    each bucket's pre-encoded spec. ``now_ms`` is for tests only; ``slot_id`` names the slot a
    concurrency limit's bucket takes (see buckets.ConcurrencySlot). A debit with ``fence`` (the
    config version the buckets' rules were compiled from) debits nothing when the store holds
    another version (``fence_flag``)."""
    specs = [bucket.spec for bucket in buckets]
    if None in specs:  # calendar quotas: their boundaries depend on the time (buckets.py)
        at_ms = periods.now_ms() if now_ms is None else now_ms
        specs = [bucket.spec or bucket.spec_at(at_ms, slot_id) for bucket in buckets]
    return [b"" if now_ms is None else int(now_ms), fence_flag(fence) if debit else b"0",
            *specs]


_SETTLE = struct.Struct("<qq")


def settled_buckets(buckets):
    """Return those of ``buckets`` a cost known after the response is settled on: those
    charged the request's cost. Not an endpoint rule's (it counts calls), a failed-authentication
    gate, nor a concurrency limit's slot (their units are not costs)."""
    return [bucket for bucket in buckets
            if not (bucket.gate or bucket.rule.endpoint or type(bucket) is ConcurrencySlot)]


def settle_args(buckets, extra, now_ms=None):
    """Return ``(keys, args)`` of settle.lua for a request that cost ``extra`` tokens more than
    it was debited at admission (negative: fewer), on ``buckets`` (those ``settled_buckets``
    keeps). Each bucket's debt bound is its rule's ``debt`` tokens. ``now_ms`` is for tests
    only (None: the Redis clock)."""
    specs = [bucket.spec for bucket in buckets]
    if None in specs:  # calendar quotas: the boundaries of the period the settle falls in
        at_ms = periods.now_ms() if now_ms is None else now_ms
        specs = [bucket.spec or bucket.spec_at(at_ms) for bucket in buckets]
    args = [b"" if now_ms is None else int(now_ms)]
    for bucket, spec in zip(buckets, specs):
        debt_units = bucket.rule.debt * bucket.period_ms
        # a difference beyond capacity + debt lands on a bound in settle.lua all the same:
        # clamped, it always fits the script's int64 arithmetic
        reach = bucket.capacity_units + debt_units
        delta_units = max(-reach, min(reach, extra * bucket.period_ms))
        args.append(spec + _SETTLE.pack(delta_units, debt_units))
    return tuple([bucket.key for bucket in buckets]), args


def fence_flag(version):
    """Return take.lua's debit flag fenced on config ``version`` (None, or a snapshot compiled
    without one, "unknown": not fenced)."""
    if version is None or version == UNKNOWN_VERSION:
        return b"1"
    return b"1" + version.encode()


# the version of a snapshot compiled while the store could not say its version; as a fence,
# no fence at all (Limiter.take: rules kept in force while no newer ones can be compiled)
UNKNOWN_VERSION = NO_FENCE = "unknown"


def statuses_from(buckets, reply):
    """Return each bucket's PolicyStatus from a store's TakeReply."""
    # a list comprehension, not a generator: no generator frame resumed per bucket
    return tuple([bucket.status(level, result == -1)
                  for bucket, level, result in zip(buckets, reply.levels, reply.results)])


def reply_statuses(buckets, reply):
    """Return the statuses of ``buckets`` (PlannedBuckets) that a store's TakeReply means: a
    LevelStatuses when the reply allowed the request and no bucket was short of its cost, on
    plain buckets (most decisions), else the tuple ``statuses_from`` builds."""
    if reply.allowed and buckets.plain and -1 not in reply.results:
        return LevelStatuses(buckets, reply.levels)
    return statuses_from(buckets, reply)


def earliest_retry_s(statuses):
    """Return the whole seconds until every enforced policy that denied holds the cost again:
    never earlier than their ``t``, at least 1 (no jitter)."""
    return max([1] + [s.reset_s for s in statuses if s.short and not s.shadow])


def refusing_without_redis(buckets):
    """Return the names of the enforced rules among ``buckets`` that refuse requests while
    Redis cannot answer (empty: the request is let through)."""
    return tuple(b.rule.name for b in buckets
                 if not b.rule.shadow and not b.rule.lets_through_without_redis())


def _decision_from(statuses, allowed, identity, endpoint, cost, jitter_token):
    violated = tuple(s.name for s in statuses if s.short and not s.shadow)
    retry_after = 0
    if not allowed:
        retry_after = retry_after_with_jitter(earliest_retry_s(statuses), jitter_token)
    return Decision(
        allowed=allowed, retry_after_s=retry_after,
        policies=statuses, violated=violated,
        shadow_violations=tuple(s.name for s in statuses if s.short and s.shadow),
        identity=identity, endpoint=endpoint, cost=cost,
    )


def degraded_decision(buckets, identity, endpoint, cost):
    """Return the Decision for ``buckets`` while the store cannot answer: refused if one of
    their enforced rules fails closed, else let through."""
    closed = refusing_without_redis(buckets)
    if closed:
        cooldown = math.ceil(get_config()["BREAKER_COOLDOWN_S"])
        return Decision(allowed=False, retry_after_s=max(1, cooldown), violated=closed,
                        identity=identity, endpoint=endpoint, cost=cost, degraded="fail-closed")
    return Decision(allowed=True, identity=identity, endpoint=endpoint, cost=cost,
                    degraded="fail-open")


def decision_from(buckets, statuses, allowed, identity, endpoint, cost, *,
                  failed_authentication=False):
    """Return the Decision that the statuses of ``buckets`` (in their order) mean.

    A refusal for failed authentication (a charge, or a failed-auth gate that refused) seeds
    its Retry-After jitter with the client IP alone: seeded with the caller's key or user, the
    wait would tell a blocked guesser whether the credentials it sent were right.
    """
    if type(statuses) is LevelStatuses:  # allowed, none short, no gate (reply_statuses)
        return _allowed(allowed, statuses, identity, endpoint, cost)
    if allowed and not any(map(_is_short, statuses)):
        # the common case, with nothing to name and no wait: the steps below would reach the
        # same Decision through three generators and _replace checks (about 1.5 µs of 2.5)
        if any(map(_is_gate, buckets)):
            statuses = tuple([s for b, s in zip(buckets, statuses, strict=True) if not b.gate])
        return _allowed(allowed, statuses, identity, endpoint, cost)
    refusing_gates = refusing_gate_statuses(buckets, statuses)
    if refusing_gates:
        shown = refusing_gates
    elif any(b.gate for b in buckets):
        shown = tuple(s for b, s in zip(buckets, statuses, strict=True) if not b.gate)
    else:
        shown = statuses
    by_ip = failed_authentication or bool(refusing_gates)
    jitter_token = identity.token_for(Scope.IP) if by_ip else identity.primary_token
    decision = _decision_from(shown, allowed, identity, endpoint, cost, jitter_token)
    if refusing_gates and not allowed:
        banned = tuple(b.rule.name for b, s in zip(buckets, statuses)
                       if type(b) is BanGate and s.short)
        if banned:
            # a ban ends at a known moment: Retry-After says when, without jitter
            return decision._replace(banned=banned, retry_after_s=earliest_retry_s(shown))
    return _refused_for_good(decision, buckets)


_is_short = operator.attrgetter("short")  # in C: any(map(...)) runs no Python frame per item
_is_gate = operator.attrgetter("gate")


def _allowed(allowed, statuses, identity, endpoint, cost):
    """Return the Decision of an allowed request no policy was short for: what _decision_from
    and _refused_for_good give then, built positionally (Decision's defaults for the rest)."""
    return _new_decision(Decision, (allowed, 0, statuses, (), (), identity, endpoint, cost,
                                    *_LATER_DEFAULTS))


_new_decision = tuple.__new__
# the defaults of the fields after ``cost`` (degraded, exempt, ...), in order
_LATER_DEFAULTS = tuple(Decision._field_defaults[f]
                        for f in Decision._fields[Decision._fields.index("cost") + 1:])


def refusing_gate_statuses(buckets, statuses):
    """Return the statuses of the failed-auth gates that refused (usually none).

    A gate is a safeguard against guessing, not a quota a well-behaved client spends: a decision
    shows it only when it refused, and then alone, so that the answer (whose policies would
    name the caller's plan) does not tell a blocked client whether its credentials were right.
    """
    return tuple(s for b, s in zip(buckets, statuses) if b.gate and s.short)


def _refused_for_good(decision, buckets):
    """Mark a denial that no wait can cure, or that only credits cure.

    An enforced bucket's capacity below the cost: such a request gets no Retry-After (any time
    given would be a promise broken), and the 429 says why (``Decision.over_capacity``). An
    enforced credit balance that refused: the answer is a 402 naming it (``out_of_credits``),
    with a Retry-After only when every such balance's allowance comes back by itself.
    """
    if decision.allowed:
        return decision
    over = tuple(b.rule.name for b in buckets
                 if b.cost_units > b.capacity_units and not b.rule.shadow)
    if over:
        return decision._replace(over_capacity=over, retry_after_s=0)
    credits = [b for b in buckets if type(b) is CreditBalance and b.rule.name in decision.violated]
    if credits:
        never_refilled = any(not b.rule.refill for b in credits)
        return decision._replace(out_of_credits=tuple(b.rule.name for b in credits),
                                 retry_after_s=0 if never_refilled else decision.retry_after_s)
    return decision
