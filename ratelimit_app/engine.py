"""The decision: every bucket that applies to a request, checked and debited in one Lua call.

``check_request`` is what the adapters call; ``plan_buckets`` and ``take`` are its two halves and
are public so the admin simulator, the dashboard inspector and the benchmarks can use them.
"""

import logging
import math
from typing import NamedTuple

from . import policy, storage
from .buckets import Bucket
from .conf import get_config, meta_key
from .deny_cache import deny_cache
from .headers import retry_after_with_jitter
from .identity import identify
from .keys import bucket_key
from .models import Scope

__all__ = ["Decision", "check_request", "failed_authentication", "plan_buckets", "take",
           "request_cost", "earliest_retry_s", "refusing_without_redis"]

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

    @property
    def limited(self):
        """True if any bucket applied (and so rate-limit headers are due)."""
        return bool(self.policies)


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


def _overrides_for(snapshot, identity):
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
        if len(memo) >= MAX_PLANS_MEMOISED:
            memo.clear()
        memo[memo_key] = found
    return found


_NOT_PLANNED = object()
MAX_PLANS_MEMOISED = 4096


def _build_buckets(snapshot, identity, endpoint, cost):
    overrides = _overrides_for(snapshot, identity)
    if any(o.exempt for o in overrides):
        return None
    prefix = get_config()["KEY_PREFIX"]
    buckets = []
    for rule in snapshot.rules_for(identity.plan, endpoint):  # widest scope first
        token = identity.token_for(rule.scope)
        if token is None:
            continue  # e.g. a user rule for an anonymous caller, a tenant rule without tenant
        if overrides and rule.scope in (Scope.USER, Scope.IP):
            rule = _with_override_numbers(rule, overrides)
        if rule.failed_auth:
            # checked, never debited here: a client IP out of failed authentications is
            # refused whatever credentials it sends now (so a right guess teaches it nothing)
            buckets.append(Bucket(rule, bucket_key(prefix, rule.id, token), 1, gate=True))
        else:
            buckets.append(Bucket(rule, bucket_key(prefix, rule.id, token),
                                  1 if rule.endpoint else cost))
    return tuple(buckets)


def _with_override_numbers(rule, overrides):
    """Return ``rule`` with the numbers of the caller's overrides that name it (or, for a rule
    counting requests, that name no rule)."""
    for o in overrides:
        if o.rule_id == rule.id or (o.rule_id is None and not rule.failed_auth):
            rule = rule.with_numbers(o.rate, o.period_s, o.burst)
    return rule


def failed_authentication(request, endpoint, *, charge=True, now_ms=None):
    """Charge one failed authentication of ``request`` to its client IP's failed-auth buckets
    (``charge=False``: only check that they hold one). Returns the Decision: refused when a
    bucket is out of tokens; None when no failed-auth rule applies or the IP is exempt.

    Failures are charged after the response (the adapters cannot know earlier that the
    credentials were wrong); the check runs where no ordinary decision is made first.
    """
    snapshot = policy.get_snapshot()
    if not snapshot.failed_auth_rules:
        return None
    identity = identify(request, None, snapshot)
    overrides = _overrides_for(snapshot, identity)
    if any(o.exempt for o in overrides):
        return None
    token = identity.token_for(Scope.IP)
    prefix = get_config()["KEY_PREFIX"]
    buckets = tuple(
        Bucket(rule, bucket_key(prefix, rule.id, token), 1)
        for rule in (_with_override_numbers(r, overrides) if overrides else r
                     for r in snapshot.rules_for(None, endpoint) if r.failed_auth))
    if not buckets:
        return None
    try:
        allowed, statuses, _ = take(buckets, now_ms=now_ms, debit=charge)
    except storage.StorageUnavailable:
        return _degraded_decision(buckets, identity, endpoint, 1)
    return _decision_from(statuses, allowed, identity, endpoint, 1)


def take(buckets, *, now_ms=None, debit=True):
    """Run the one Lua call for ``buckets`` and return ``(allowed, statuses, config_version)``.

    ``now_ms`` is for tests only (the default is the Redis server clock). Raises
    ``storage.StorageUnavailable`` when Redis cannot answer.
    """
    args = [b"" if now_ms is None else int(now_ms), b"1" if debit else b"0"]
    for bucket in buckets:
        args.extend(bucket.lua_args)
    reply = storage.run_take([b.key for b in buckets], args)
    allowed, version = reply[0] == 1, reply[1]
    version = version.decode() if isinstance(version, bytes) else str(version)
    statuses = tuple(
        bucket.status(reply[3 + 2 * i], reply[4 + 2 * i] == -1)
        for i, bucket in enumerate(buckets)
    )
    return allowed, statuses, version


def earliest_retry_s(statuses):
    """Return the whole seconds until every enforced policy that denied holds the cost again:
    never earlier than their ``t``, at least 1 (no jitter)."""
    return max([1] + [s.reset_s for s in statuses if s.short and not s.shadow])


def refusing_without_redis(buckets):
    """Return the names of the enforced rules among ``buckets`` that refuse requests while
    Redis cannot answer (empty: the request is let through)."""
    return tuple(b.rule.name for b in buckets
                 if not b.rule.shadow and not b.rule.lets_through_without_redis())


def _decision_from(statuses, allowed, identity, endpoint, cost):
    violated = tuple(s.name for s in statuses if s.short and not s.shadow)
    retry_after = 0
    if not allowed:
        retry_after = retry_after_with_jitter(earliest_retry_s(statuses), identity.primary_token)
    return Decision(
        allowed=allowed, retry_after_s=retry_after,
        policies=statuses, violated=violated,
        shadow_violations=tuple(s.name for s in statuses if s.short and s.shadow),
        identity=identity, endpoint=endpoint, cost=cost,
    )


def _degraded_decision(buckets, identity, endpoint, cost):
    closed = refusing_without_redis(buckets)
    if closed:
        cooldown = math.ceil(get_config()["BREAKER_COOLDOWN_S"])
        return Decision(allowed=False, retry_after_s=max(1, cooldown), violated=closed,
                        identity=identity, endpoint=endpoint, cost=cost, degraded="fail-closed")
    return Decision(allowed=True, identity=identity, endpoint=endpoint, cost=cost,
                    degraded="fail-open")


def check_request(request, user, endpoint, *, now_ms=None):
    """Decide one request: identity, policy, buckets, the Lua call. Returns a Decision.

    ``user`` is the authenticated user (or None); ``endpoint`` the URL name of the view.
    Raises nothing the caller must handle except programming errors.
    """
    snapshot = policy.get_snapshot()
    identity = identify(request, user, snapshot)
    cost = request_cost(snapshot, request, endpoint, identity.plan)
    buckets = plan_buckets(snapshot, identity, endpoint, cost)
    if buckets is None:
        return Decision(allowed=True, identity=identity, endpoint=endpoint, cost=cost, exempt=True)
    if not buckets:
        return Decision(allowed=True, identity=identity, endpoint=endpoint, cost=cost)
    cached = deny_cache.lookup(buckets, snapshot.version)
    if cached is not None:
        return _refused_for_good(_decision_from(_shown(buckets, cached), False, identity,
                                                endpoint, cost)._replace(from_deny_cache=True),
                                 buckets)
    sent_at = deny_cache.now()  # the cache's own clock, so an injected one stays consistent
    try:
        allowed, statuses, version = take(buckets, now_ms=now_ms)
    except storage.StorageUnavailable:
        return _degraded_decision(buckets, identity, endpoint, cost)
    policy.observe_version(version)
    if now_ms is None:
        # the snapshot's version, not the reply's: the levels are only a valid bound for the
        # rules these buckets were built from
        deny_cache.learn(buckets, statuses, allowed, snapshot.version, sent_at)
    return _refused_for_good(_decision_from(_shown(buckets, statuses), allowed, identity,
                                            endpoint, cost), buckets)


def _shown(buckets, statuses):
    """Return the statuses a decision reports. A failed-auth gate is a safeguard against
    guessing, not a quota a well-behaved client spends: it is shown only when it refused, and
    then alone, so that the answer (whose policies would name the caller's plan) does not
    tell a blocked client whether the credentials it sent were right."""
    if not any(b.gate for b in buckets):
        return statuses
    pairs = tuple(zip(buckets, statuses, strict=True))
    refusing_gates = tuple(s for b, s in pairs if b.gate and s.short)
    return refusing_gates or tuple(s for b, s in pairs if not b.gate)


def _refused_for_good(decision, buckets):
    """Mark a denial that no wait can cure: an enforced bucket's capacity is below the cost.

    Such a request gets no Retry-After (any time given would be a promise broken), and the
    429 says why (``Decision.over_capacity``).
    """
    if decision.allowed:
        return decision
    over = tuple(b.rule.name for b in buckets
                 if b.cost_units > b.capacity_units and not b.rule.shadow)
    return decision._replace(over_capacity=over, retry_after_s=0) if over else decision
