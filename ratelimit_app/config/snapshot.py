"""The snapshot: the quota configuration as the request path reads it, immutable, in memory.

``Snapshot`` holds the rules in force (``CompiledRule``, numbers pre-encoded for take.lua), the
plans, the API keys, the identity overrides and the allow and deny lists of one config version, as ``compiler.py``
compiled them from the rows; ``policy.PolicyCache`` keeps the one in force.
"""
import functools
import math
from dataclasses import dataclass, field

from ..conf import get_config
from .factors import scaled_limits

__all__ = ["CompiledRule", "ApiKeyEntry", "OverrideEntry", "Snapshot", "SCOPE_ORDER"]

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
    # counts failed authentications of a client IP instead of requests (see decision/engine.py)
    failed_auth: bool = False
    # tokens a worker leases at a time from this (shared) bucket; 0: no lease (see
    # decision/leases.py)
    lease: int = 0
    # a calendar quota's period ("day" or "month", see decision/periods.py): ``rate`` units per
    # period; "": a token bucket
    calendar: str = ""
    # a concurrency limit: at most ``rate`` requests in flight, each slot freed after
    # ``period_s`` at the latest (see buckets.ConcurrencySlot)
    concurrency: bool = False
    # alert thresholds, percent of the quota used, ascending (see business/alerts/crossings.py);
    # (): no alerts
    alerts: tuple = ()
    # tokens a settle may take the bucket below empty when a request cost more than it was
    # admitted for (see stores/lua/settle.lua); what would go further is not charged
    debt: int = 0
    # prepaid credits: the account's balance (see decision/balances.py), its allowance ``rate``
    # units per ``refill`` ("day" or "month"; "": given once, never refilled)
    credits: bool = False
    refill: str = ""
    # a rule counting responses (issue 50 §2): only those with a status in this set (empty:
    # any) under this path prefix ("": any) cost a token, charged once the response is sent
    # (settle.lua); on its way in a request is only checked (see engine.ResponseCounter)
    response_statuses: tuple = ()
    response_prefix: str = ""

    @property
    def counts_responses(self):
        """True if this rule charges responses after they are sent, not requests."""
        return bool(self.response_statuses or self.response_prefix)

    def lets_through_without_redis(self):
        """Return True if this rule allows requests while Redis cannot answer."""
        return get_config()["FAIL_OPEN"] if self.fail_open is None else self.fail_open

    def with_numbers(self, rate, period_s, burst):
        """Return a copy with an identity override's own numbers."""
        return CompiledRule(self.id, self.name, self.scope, self.plan, self.endpoint,
                            rate, period_s, burst, self.shadow, self.fail_open, self.failed_auth,
                            self.lease, self.calendar, self.concurrency, self.alerts, self.debt,
                            self.credits, self.refill, self.response_statuses,
                            self.response_prefix)

    def scaled(self, factor):
        """Return a copy with this rule's numbers × ``factor`` (an identity override's, a
        Decimal; see factors.py): a token bucket's rate and burst, a calendar quota's units, a
        concurrency limit's requests in flight."""
        rate, burst = scaled_limits(factor, rate=self.rate, period_s=self.period_s,
                                    burst=self.burst, calendar=bool(self.calendar),
                                    concurrency=self.concurrency)
        return self.with_numbers(rate, self.period_s, burst)


@dataclass(frozen=True, slots=True)
class ApiKeyEntry:
    id: int
    prefix: str
    user_id: str
    plan: str | None
    tenant: str


@dataclass(frozen=True, slots=True)
class OverrideEntry:
    """One identity override in force: exempt, or its own numbers, or (``factor``, a Decimal)
    the numbers of the rules it names × the factor."""

    exempt: bool
    rule_id: int | None
    rate: int | None
    period_s: int | None
    burst: int | None
    factor: object = None


@dataclass
class Snapshot:
    """Everything the request path needs, compiled from the database at one config version."""

    version: str
    rules: tuple = ()
    failed_auth_rules: tuple = ()  # the rules among ``rules`` that count failed authentications
    alerting_rules: tuple = ()     # those with alert thresholds the request path checks
    ban_rules: tuple = ()          # the penalty box's rules (protection/bans.CompiledBanRule)
    plans: frozenset = frozenset()
    default_authenticated_plan: str | None = None
    default_anonymous_plan: str | None = None
    api_keys: dict = field(default_factory=dict)      # digest -> ApiKeyEntry
    assignments: dict = field(default_factory=dict)   # str(user pk) -> (plan slug, tenant)
    overrides: dict = field(default_factory=dict)     # ("user"|"key"|"ip", value) -> entries
    costs: dict = field(default_factory=dict)         # (endpoint, method, plan) -> tokens
    # (endpoint, method, plan) -> a metered row's minimum charge, or None for a row that is not
    # metered; empty when no row is metered (the request path then looks no further)
    metering: dict = field(default_factory=dict)
    # the allow and deny list entries in force (protection/lists.py AccessLists); None when
    # there are none (the request path then looks no further)
    access_lists: object = None
    # wall-clock time (epoch s) a dated assignment or override next starts or ends: the
    # snapshot is out of date from then on
    next_change_at: float = math.inf
    # the wall-clock time (epoch s) the dated rows were evaluated at
    compiled_at: float = 0.0
    # the next start or end among each dated part's rows (see PARTS): kept for a later compile
    # that reads only other parts
    part_moments: dict = field(default_factory=dict, repr=False)
    # each patchable part's compiler.RowIndex: what a compile of a few of its rows needs
    part_rows: dict = field(default_factory=dict, repr=False)
    _rules_for: dict = field(default_factory=dict, repr=False)
    # engine.plan_buckets' memo: (identity, endpoint, cost) -> buckets; never copied by replace()
    buckets_memo: dict = field(default_factory=dict, repr=False, init=False, compare=False)

    @functools.cached_property
    def response_rules(self):
        """The rules among ``rules`` that count responses (usually none)."""
        return tuple(rule for rule in self.rules if rule.counts_responses)

    @functools.cached_property
    def counts_responses(self):
        """True when a response is counted once sent: a ban rule, or a rule counting responses
        (read after every response: an attribute once computed)."""
        return bool(self.ban_rules or self.response_rules)

    @property
    def has_alerts(self):
        """True when a rule has alert thresholds the request path checks (see
        business/alerts/crossings.py)."""
        return bool(self.alerting_rules)

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
        cost = _most_specific(costs, endpoint, method, plan)
        return 1 if cost is None else cost

    def minimum_if_metered(self, endpoint, method, plan):
        """Return the minimum charge of a request whose cost is metered (known after the
        response), or None when its cost is known before: the row ``cost_for`` reads says."""
        return _most_specific(self.metering, endpoint, method, plan) if self.metering else None


def _most_specific(table, endpoint, method, plan):
    """Return the value of the most specific row of ``table`` (keyed by (endpoint, method,
    plan)) for a request, as ``Snapshot.cost_for`` orders them, or None when none matches."""
    methods = _COST_METHODS.get(method, (method, "*"))
    for row_plan in (plan, None):
        for row_method in methods:
            value = table.get((endpoint, row_method, row_plan), _NO_ROW)
            if value is not _NO_ROW:
                return value
    return None


_NO_ROW = object()


# Which EndpointCost methods price a request, most specific first.
_COST_METHODS = {"HEAD": ("HEAD", "GET", "*")}

