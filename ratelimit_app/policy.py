"""DB rows → an immutable in-process snapshot, reloaded when the config version in Redis changes.

The request path reads only the snapshot: no database query per request once it is warm. Every
committed admin change writes a new version (``signals.py``); a worker notices it in the reply of
its next Lua call (the script returns it for free), or by asking the store when it has not made
a call for ``CONFIG_CHECK_INTERVAL_S``, and reloads (``PolicyCache``, owned by the Limiter).
"""

import logging
import threading
import time
from dataclasses import dataclass, field

from .conf import get_config

__all__ = ["CompiledRule", "Snapshot", "PolicyCache", "compile_snapshot"]

logger = logging.getLogger("ratelimit_app")

# The hierarchy, from the widest scope to the narrowest: the order buckets are reported in.
SCOPE_ORDER = {"global": 0, "plan": 1, "tenant": 2, "user": 3, "ip": 3}


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule as the engine needs it. ``fail_open`` is None when the project default applies."""

    id: int
    name: str
    scope: str
    plan: str | None
    endpoint: str
    rate: int
    period_s: int
    burst: int
    shadow: bool
    fail_open: bool | None
    # counts failed authentications of a client IP instead of requests (see engine.py)
    failed_auth: bool = False
    # tokens a worker leases at a time from this (shared) bucket; 0: no lease (see leases.py)
    lease: int = 0
    # a calendar quota's period ("day" or "month", see periods.py): ``rate`` units per period;
    # "": a token bucket
    calendar: str = ""
    # a concurrency limit: at most ``rate`` requests in flight, each slot freed after
    # ``period_s`` at the latest (see buckets.ConcurrencySlot)
    concurrency: bool = False

    def lets_through_without_redis(self):
        """Return True if this rule allows requests while Redis cannot answer."""
        return get_config()["FAIL_OPEN"] if self.fail_open is None else self.fail_open

    def with_numbers(self, rate, period_s, burst):
        """Return a copy with an identity override's own numbers."""
        return CompiledRule(self.id, self.name, self.scope, self.plan, self.endpoint,
                            rate, period_s, burst, self.shadow, self.fail_open, self.failed_auth,
                            self.lease, self.calendar, self.concurrency)


@dataclass(frozen=True, slots=True)
class ApiKeyEntry:
    id: int
    prefix: str
    user_id: str
    plan: str | None
    tenant: str


@dataclass(frozen=True, slots=True)
class OverrideEntry:
    exempt: bool
    rule_id: int | None
    rate: int | None
    period_s: int | None
    burst: int | None


@dataclass
class Snapshot:
    """Everything the request path needs, compiled from the database at one config version."""

    version: str
    rules: tuple = ()
    failed_auth_rules: tuple = ()  # the rules among ``rules`` that count failed authentications
    has_leases: bool = False       # a rule leases tokens to workers (see leases.py)
    has_concurrency: bool = False  # a rule limits requests in flight (see buckets.py)
    plans: frozenset = frozenset()
    default_authenticated_plan: str | None = None
    default_anonymous_plan: str | None = None
    api_keys: dict = field(default_factory=dict)      # digest -> ApiKeyEntry
    assignments: dict = field(default_factory=dict)   # str(user pk) -> (plan slug, tenant)
    overrides: dict = field(default_factory=dict)     # ("user"|"key"|"ip", value) -> entries
    costs: dict = field(default_factory=dict)         # (endpoint, method, plan) -> tokens
    _rules_for: dict = field(default_factory=dict, repr=False)
    # engine.plan_buckets' memo: (identity, endpoint, cost) -> buckets; never copied by replace()
    buckets_memo: dict = field(default_factory=dict, repr=False, init=False, compare=False)

    def rules_for(self, plan, endpoint):
        """Return the enabled rules that apply to a plan and endpoint, widest scope first and
        endpoint rules last within a scope (memoised per pair, so the cost does not grow with
        rules that do not apply)."""
        cache_key = (plan, endpoint)
        found = self._rules_for.get(cache_key)
        if found is None:
            found = tuple(sorted(
                (r for r in self.rules
                 if (r.plan is None or r.plan == plan) and (not r.endpoint or r.endpoint == endpoint)),
                key=lambda r: (SCOPE_ORDER[r.scope], bool(r.endpoint)),
            ))
            if len(self._rules_for) < 10_000:  # endpoints are finite; bound it anyway
                self._rules_for[cache_key] = found
        return found

    def cost_for(self, endpoint, method, plan):
        """Return the tokens a request costs: the most specific EndpointCost row, else 1.

        A plan's own rows come before rows for every plan; within each, the method's row before
        "any method". HEAD is served by the GET view, so it costs what GET costs unless a row
        names HEAD itself.
        """
        costs = self.costs
        if not costs:
            return 1
        methods = _COST_METHODS.get(method, (method, "*"))
        for row_plan in (plan, None):
            for row_method in methods:
                cost = costs.get((endpoint, row_method, row_plan))
                if cost is not None:
                    return cost
        return 1


# Which EndpointCost methods price a request, most specific first.
_COST_METHODS = {"HEAD": ("HEAD", "GET", "*")}


def compile_snapshot(version):
    """Read every configuration row and return a Snapshot (the only DB access of the app).

    The reads run in an atomic block of their own: inside a caller's transaction (a view under
    ATOMIC_REQUESTS, a management command) that is a savepoint, so a failed read (a table being
    migrated) is rolled back alone instead of aborting the caller's transaction on PostgreSQL.
    """
    from django.db import router, transaction

    from .models import Rule

    with transaction.atomic(using=router.db_for_read(Rule)):
        return _read_snapshot(version)


def _read_snapshot(version):
    from .identity import limited_ip
    from .models import (ApiKey, Counts, EndpointCost, FailureMode, IdentityOverride, Kind, Mode,
                         Plan, PlanAssignment, Rule)

    plans = list(Plan.objects.all())
    rules = tuple(
        CompiledRule(
            id=r.id, name=r.name, scope=r.scope, plan=r.plan.slug if r.plan_id else None,
            endpoint=r.endpoint, rate=r.rate, period_s=r.period_s, burst=r.burst,
            shadow=r.mode == Mode.SHADOW,
            fail_open={FailureMode.OPEN: True, FailureMode.CLOSED: False}.get(r.on_redis_failure),
            failed_auth=r.counts == Counts.FAILED_AUTH,
            lease=r.lease,
            calendar=r.calendar_period if r.kind == Kind.CALENDAR else "",
            concurrency=r.kind == Kind.CONCURRENCY,
        )
        for r in Rule.objects.filter(enabled=True).select_related("plan").order_by("id")
    )
    assignments = {
        str(a.user_id): (a.plan.slug, a.tenant)
        for a in PlanAssignment.objects.select_related("plan")
    }
    api_keys = {
        k.digest: ApiKeyEntry(k.id, k.prefix, str(k.user_id), k.plan.slug if k.plan_id else None,
                              k.tenant)
        for k in ApiKey.objects.filter(active=True).select_related("plan")
    }
    overrides = {}
    for o in IdentityOverride.objects.all():
        if o.user_id:
            who = ("user", str(o.user_id))
        elif o.api_key_id:
            who = ("key", o.api_key_id)
        else:
            who = ("ip", limited_ip(o.ip))  # as identify() sees it: an IPv6 client is its /64
        overrides.setdefault(who, []).append(
            OverrideEntry(o.exempt, o.rule_id, o.rate, o.period_s, o.burst))
    costs = {
        (c.endpoint, c.method, c.plan.slug if c.plan_id else None): c.cost
        for c in EndpointCost.objects.select_related("plan")
    }
    return Snapshot(
        version=version,
        rules=rules,
        failed_auth_rules=tuple(r for r in rules if r.failed_auth),
        has_leases=any(r.lease for r in rules),
        has_concurrency=any(r.concurrency for r in rules),
        plans=frozenset(p.slug for p in plans),
        default_authenticated_plan=next((p.slug for p in plans if p.default_for_authenticated), None),
        default_anonymous_plan=next((p.slug for p in plans if p.default_for_anonymous), None),
        api_keys=api_keys,
        assignments=assignments,
        overrides={k: tuple(v) for k, v in overrides.items()},
        costs=costs,
    )


class PolicyCache:
    """A process's current snapshot and what it knows about the config version in the store.

    ``read_version`` is a callable returning the version string (raising ``StoreUnavailable``
    when the store cannot answer); ``load`` compiles a Snapshot for a version (the database);
    ``clock`` is monotonic seconds. The Limiter owns one.
    """

    def __init__(self, read_version, *, check_interval_s, clock=time.monotonic,
                 load=None):
        self._read_version = read_version
        self._load = load or compile_snapshot
        self.check_interval_s = check_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self.snapshot = None
        self.stale = True
        self.checked_at = 0.0  # clock time the version was last confirmed
        self.retry_at = 0.0    # after a failed load: clock time the DB may be tried again

    def invalidate(self):
        """Reload at the next request, keeping the current rules if the reload fails."""
        self.stale = True

    def reset(self):
        """Drop the snapshot; the next request compiles a new one."""
        with self._lock:
            self.snapshot = None
            self.stale = True
            self.retry_at = 0.0

    def observe_version(self, version):
        """Record the config version a store reply carried (None: the reply had none); any
        difference from the snapshot's, up or down, makes the snapshot stale."""
        if version is None:
            return
        self.checked_at = self._clock()
        snapshot = self.snapshot
        if snapshot is not None and version != snapshot.version:
            self.stale = True

    def get(self):
        """Return the current snapshot, reloading it if the config version changed."""
        snapshot = self.snapshot
        if snapshot is not None and not self.stale:
            if self._clock() - self.checked_at < self.check_interval_s:
                return snapshot
            self._poll_version(snapshot)
            if not self.stale:
                return snapshot
        if snapshot is not None and self._clock() < self.retry_at:
            return snapshot  # the last load failed moments ago; replies keep marking it stale
        return self._reload()

    def current(self):
        """Return the snapshot ``get()`` would return without reading the store or the
        database, or None when it has to (the async path then runs ``get`` in a thread)."""
        snapshot = self.snapshot
        if snapshot is None:
            return None
        now = self._clock()
        if not self.stale:
            return snapshot if now - self.checked_at < self.check_interval_s else None
        return snapshot if now < self.retry_at else None

    def _version_or(self, fallback):
        from .stores import StoreUnavailable

        try:
            return self._read_version()
        except StoreUnavailable:
            return fallback

    def _poll_version(self, snapshot):
        self.checked_at = self._clock()
        version = self._version_or(None)  # None: keep serving the rules we have
        if version is not None and version != snapshot.version:
            self.stale = True

    def _reload(self):
        with self._lock:
            if self.snapshot is not None and not self.stale:
                return self.snapshot  # another thread reloaded while we waited
            # "unknown" differs from any real version: reload once the store answers
            version = self._version_or("unknown")
            try:
                snapshot = self._load(version)
            except Exception:  # a DB outage must not turn into 500s: keep the old rules
                logger.exception("ratelimit_app: could not load the quota configuration")
                if self.snapshot is None:
                    self.snapshot = Snapshot(version="unknown")
                # try again at the next version poll, not on every request
                self.stale = False
                self.checked_at = self._clock()
                self.retry_at = self.checked_at + self.check_interval_s
                return self.snapshot
            self.snapshot = snapshot
            self.stale = False
            self.checked_at = self._clock()
            return snapshot
