"""DB rows → an immutable in-process snapshot, kept fresh as the configuration changes.

The request path reads only the snapshot: no database query per request once it is warm. Every
committed admin change publishes a new config version in Redis (``runtime/signals.py``). From then on:

- no debit is made on older rules: each take.lua call is fenced on the version its rules were
  compiled from, debits nothing when the store holds another, and the decision is made again
  on fresh rules (``Limiter``; on a Cluster the version is copied into every slot);
- each worker's watcher thread reads the version every ``CONFIG_WATCH_INTERVAL_S`` (one GET)
  and compiles the new rules off the request path (``PolicyCache``), so the fence seldom fires.

Rows changed without a signal (a queryset's ``update()``, ``bulk_create``, raw SQL, a data
migration) announce nothing: for them the watcher compares a digest of the rows with its
snapshot's once every ``CONFIG_RELOAD_INTERVAL_S`` (one query, ``config_fingerprint``), and the
first worker to see a difference announces a new version (recorded once in the audit trail).

Plan assignments, identity overrides and the plan of an API key may have a start and an end
(``models.Scheduled``): a snapshot holds only the rows active when it was compiled, and the
next moment one starts or ends (``Snapshot.next_change_at``); the snapshot of that moment is
compiled ahead and swapped in at the moment (``PolicyCache``).
"""
import functools
import hashlib
import itertools
import logging
import marshal
import math
import operator
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..conf import get_config
from ..process.background import WorkerThread
from ..stores.base import StoreUnavailable
from .versions import PUBLICATION_WAIT_S, published_ms

__all__ = ["CompiledRule", "Snapshot", "PolicyCache", "compile_snapshot", "config_fingerprint"]

logger = logging.getLogger("ratelimit_app")

# The longest a worker trusts its monotonic clock to say when a dated row starts or ends: the
# wall clock is read again after this long (it may have been stepped meanwhile).
SCHEDULE_RECHECK_S = 60.0

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
    # tokens a worker leases at a time from this (shared) bucket; 0: no lease (see decision/leases.py)
    lease: int = 0
    # a calendar quota's period ("day" or "month", see decision/periods.py): ``rate`` units per period;
    # "": a token bucket
    calendar: str = ""
    # a concurrency limit: at most ``rate`` requests in flight, each slot freed after
    # ``period_s`` at the latest (see buckets.ConcurrencySlot)
    concurrency: bool = False
    # alert thresholds, percent of the quota used, ascending (see business/alerts/crossings.py); (): no alerts
    alerts: tuple = ()

    def lets_through_without_redis(self):
        """Return True if this rule allows requests while Redis cannot answer."""
        return get_config()["FAIL_OPEN"] if self.fail_open is None else self.fail_open

    def with_numbers(self, rate, period_s, burst):
        """Return a copy with an identity override's own numbers."""
        return CompiledRule(self.id, self.name, self.scope, self.plan, self.endpoint,
                            rate, period_s, burst, self.shadow, self.fail_open, self.failed_auth,
                            self.lease, self.calendar, self.concurrency, self.alerts)


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
    has_alerts: bool = False       # a rule has alert thresholds (see business/alerts/crossings.py)
    plans: frozenset = frozenset()
    default_authenticated_plan: str | None = None
    default_anonymous_plan: str | None = None
    api_keys: dict = field(default_factory=dict)      # digest -> ApiKeyEntry
    assignments: dict = field(default_factory=dict)   # str(user pk) -> (plan slug, tenant)
    overrides: dict = field(default_factory=dict)     # ("user"|"key"|"ip", value) -> entries
    costs: dict = field(default_factory=dict)         # (endpoint, method, plan) -> tokens
    # wall-clock time (epoch s) a dated assignment or override next starts or ends: the
    # snapshot is out of date from then on
    next_change_at: float = math.inf
    # the wall-clock time (epoch s) the dated rows were evaluated at
    compiled_at: float = 0.0
    # the next start or end among each dated part's rows (see PARTS): kept for a later compile
    # that reads only other parts
    part_moments: dict = field(default_factory=dict, repr=False)
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


def _alert_thresholds(rule, parse):
    """Return a rule row's alert thresholds, or () (logged) for a value clean() would refuse,
    written without it (a queryset's update(), raw SQL): alerts are not worth a failed reload."""
    if not rule.alert_thresholds:
        return ()
    try:
        return parse(rule.alert_thresholds)
    except ValueError as exc:
        logger.warning("ratelimit_app: rule %s: alert thresholds %r ignored: %s", rule.name,
                       rule.alert_thresholds, exc)
        return ()


def _next_change(rows, now):
    """Return the earliest start or end after the datetime ``now`` among ``rows`` (epoch s),
    or ``math.inf`` when none lies ahead."""
    moments = [moment for row in rows for moment in (row.starts_at, row.ends_at)
               if moment is not None and moment > now]
    return min(moments).timestamp() if moments else math.inf


def compile_snapshot(version, now=None, pause_s=0.0, *, base=None, changed=None):
    """Read the configuration rows and return a Snapshot (the only DB access of the app).

    ``now`` (epoch s; default: the wall clock) picks the dated assignments and overrides
    that are active; the snapshot records when the next one starts or ends. With ``pause_s``
    (a thread's), it sleeps that long after every ``FINGERPRINT_CHUNK_ROWS`` rows it builds,
    for the reason ``config_fingerprint`` does (the GIL; see ``_paced``).

    With ``base`` (a snapshot compiled earlier) and ``changed`` (the model names of the tables
    changed since, ``parts_to_read``), only the parts those tables feed are read again, the
    others are taken from ``base``: an edit of one rule reads the rules, not every API key.

    The reads run in an atomic block of their own: inside a caller's transaction (a view under
    ATOMIC_REQUESTS, a management command) that is a savepoint, so a failed read (a table being
    migrated) is rolled back alone instead of aborting the caller's transaction on PostgreSQL.
    """
    from django.db import router, transaction

    from .models import Rule

    at = time.time() if now is None else now
    parts = parts_to_read(base, changed, at)
    with transaction.atomic(using=router.db_for_read(Rule)):
        return _read_snapshot(version, at, parts, base, pause_s)


# A snapshot's parts, named after the model whose rows each is compiled from, with the Snapshot
# fields each fills. Every part reads plan slugs (``plan__slug``), so a change of plans reads
# them all; the dated parts are read again too once one of their moments has passed.
PARTS = {
    "plan": ("plans", "default_authenticated_plan", "default_anonymous_plan"),
    "rule": ("rules", "failed_auth_rules", "has_alerts", "_rules_for"),
    "planassignment": ("assignments",),
    "apikey": ("api_keys",),
    "identityoverride": ("overrides",),
    "endpointcost": ("costs",),
}
DATED_PARTS = frozenset({"planassignment", "apikey", "identityoverride"})


def parts_to_read(base, changed, at):
    """Return the parts (PARTS' names) a compile at ``at`` (epoch s) must read: every one
    without a ``base`` or a known ``changed`` set of model names, else those ``changed`` feeds,
    with the dated parts when one of ``base``'s moments passed before ``at``."""
    if base is None or changed is None or "plan" in changed:
        return frozenset(PARTS)
    parts = frozenset(changed) & frozenset(PARTS)
    if base.next_change_at <= at:
        parts |= DATED_PARTS
    return parts


def _paced(queryset, pause_s):
    """Return ``queryset``'s rows as an iterable; with ``pause_s``, one that sleeps that long
    after every FINGERPRINT_CHUNK_ROWS rows. Building the rows holds the GIL (about 10 ms for
    the bench's 1,954 rows): in a thread that never pauses, a request thread returning from a
    system call (Redis, its client) waits up to the interpreter's 5 ms switch interval for it,
    several times per request."""
    if not pause_s:
        return queryset
    return _paced_rows(queryset, pause_s)


def _paced_rows(queryset, pause_s):
    for count, row in enumerate(queryset.iterator(chunk_size=2000), 1):
        yield row
        if count % FINGERPRINT_CHUNK_ROWS == 0:
            _pause(pause_s)


def _pause(pause_s):
    """Sleep ``pause_s`` seconds; a callable gives the pause at each call (PolicyCache's: none
    while a request waits for the compile, see PolicyCache.fresh)."""
    seconds = pause_s() if callable(pause_s) else pause_s
    if seconds:
        time.sleep(seconds)


def _rows(queryset, *fields, pause_s=0.0):
    """Return ``queryset``'s rows as named tuples of ``fields`` (paced, see _paced). Tuples,
    not model instances: a compile of the bench's rows then takes 11 ms instead of 33 ms, and
    every worker compiles at every edit."""
    return list(_paced(queryset.values_list(*fields, named=True), pause_s))


def _read_snapshot(version, at, parts, base, pause_s):
    moment = datetime.fromtimestamp(at, tz=timezone.utc)
    fields, part_moments = {}, {}
    for part, names in PARTS.items():
        if part in parts:
            read, next_moment = _PART_READERS[part](moment, pause_s)
            fields.update(read)
            if next_moment != math.inf:
                part_moments[part] = next_moment
        else:
            fields.update((name, getattr(base, name)) for name in names)
            if part in base.part_moments:
                part_moments[part] = base.part_moments[part]
    return Snapshot(version=version, compiled_at=at, part_moments=part_moments,
                    next_change_at=min(part_moments.values(), default=math.inf), **fields)


def _read_plans(moment, pause_s):
    from .models import Plan

    plans = _rows(Plan.objects.all(), "slug", "default_for_authenticated",
                  "default_for_anonymous", pause_s=pause_s)
    return {
        "plans": frozenset(p.slug for p in plans),
        "default_authenticated_plan": next((p.slug for p in plans
                                            if p.default_for_authenticated), None),
        "default_anonymous_plan": next((p.slug for p in plans if p.default_for_anonymous), None),
    }, math.inf


def _read_rules(moment, pause_s):
    from .models import Counts, FailureMode, Kind, Mode, Rule, parse_alert_thresholds

    fail_open = {FailureMode.OPEN: True, FailureMode.CLOSED: False}
    rules = tuple(
        CompiledRule(
            id=r.id, name=r.name, scope=r.scope, plan=r.plan__slug,
            endpoint=r.endpoint, rate=r.rate, period_s=r.period_s, burst=r.burst,
            shadow=r.mode == Mode.SHADOW,
            fail_open=fail_open.get(r.on_redis_failure),
            failed_auth=r.counts == Counts.FAILED_AUTH,
            lease=r.lease,
            calendar=r.calendar_period if r.kind == Kind.CALENDAR else "",
            concurrency=r.kind == Kind.CONCURRENCY,
            alerts=_alert_thresholds(r, parse_alert_thresholds),
        )
        for r in _rows(Rule.objects.filter(enabled=True).order_by("id"),
                       "id", "name", "scope", "plan__slug", "endpoint", "rate", "period_s",
                       "burst", "mode", "on_redis_failure", "counts", "lease", "calendar_period",
                       "kind", "alert_thresholds", pause_s=pause_s)
    )
    return {
        "rules": rules,
        "failed_auth_rules": tuple(r for r in rules if r.failed_auth),
        "has_alerts": any(r.alerts for r in rules),
        "_rules_for": {},  # the memo of rules_for starts afresh with new rules
    }, math.inf


def _read_assignments(moment, pause_s):
    from .models import PlanAssignment, active_at

    rows = _rows(PlanAssignment.objects.all(), "user_id", "plan__slug", "tenant", "starts_at",
                 "ends_at", pause_s=pause_s)
    assignments = {str(a.user_id): (a.plan__slug, a.tenant)
                   for a in rows if active_at(a.starts_at, a.ends_at, moment)}
    return {"assignments": assignments}, _next_change(rows, moment)


def _read_api_keys(moment, pause_s):
    from .models import ApiKey, active_at

    rows = _rows(ApiKey.objects.filter(active=True), "id", "digest", "prefix", "user_id",
                 "plan_id", "plan__slug", "tenant", "starts_at", "ends_at", pause_s=pause_s)
    # a key's plan outside its dates is None: the key is on its user's plan meanwhile
    api_keys = {
        k.digest: ApiKeyEntry(k.id, k.prefix, str(k.user_id),
                              k.plan__slug if k.plan_id and active_at(k.starts_at, k.ends_at,
                                                                      moment) else None,
                              k.tenant)
        for k in rows
    }
    return {"api_keys": api_keys}, _next_change([k for k in rows if k.plan_id], moment)


def _read_overrides(moment, pause_s):
    from ..decision.identity import limited_ip
    from .models import IdentityOverride, active_at

    rows = _rows(IdentityOverride.objects.order_by("id"), "user_id", "api_key_id", "ip",
                 "exempt", "rule_id", "rate", "period_s", "burst", "starts_at", "ends_at",
                 pause_s=pause_s)
    overrides = {}
    # the dated ones after the permanent ones: the engine applies them in order, the last wins
    active = sorted((o for o in rows if active_at(o.starts_at, o.ends_at, moment)),
                    key=lambda o: o.starts_at is not None or o.ends_at is not None)
    for o in active:
        if o.user_id:
            who = ("user", str(o.user_id))
        elif o.api_key_id:
            who = ("key", o.api_key_id)
        else:
            who = ("ip", limited_ip(o.ip))  # as identify() sees it: an IPv6 client is its /64
        overrides.setdefault(who, []).append(
            OverrideEntry(o.exempt, o.rule_id, o.rate, o.period_s, o.burst))
    return {"overrides": {k: tuple(v) for k, v in overrides.items()}}, \
        _next_change(rows, moment)


def _read_costs(moment, pause_s):
    from .models import EndpointCost

    costs = {(c.endpoint, c.method, c.plan__slug): c.cost
             for c in _rows(EndpointCost.objects.all(), "endpoint", "method", "plan__slug",
                            "cost", pause_s=pause_s)}
    return {"costs": costs}, math.inf


_PART_READERS = {
    "plan": _read_plans,
    "rule": _read_rules,
    "planassignment": _read_assignments,
    "apikey": _read_api_keys,
    "identityoverride": _read_overrides,
    "endpointcost": _read_costs,
}


# config_fingerprint reads and hashes this many rows at a time (see its pause_s), and a paced
# compile_snapshot builds this many between pauses: a few tenths of a millisecond of CPU. Then
# the comparison pauses COMPARISON_PAUSE_S, in which a request thread can take the GIL: with
# the bench's 1,954 rows a comparison lasts about 100 ms, for 12.6 ms of CPU against 7.3 ms in
# one go, and a request that gives the GIL up for a moment (each call to Redis) seldom finds it
# taken on return (docs/howto/apply-edits.md).
FINGERPRINT_CHUNK_ROWS = 50
COMPARISON_PAUSE_S = 0.001
# The pause of the watcher's compile of a dated row's snapshot ahead of its moment: nobody
# waits for it, so it keeps its share of its worker's GIL to about 10 %. (The compiles of the
# rules in force are not paced: requests are fenced until they are done.)
RELOAD_PAUSE_S = 0.003


def config_models():
    """Return the models whose rows ``compile_snapshot`` reads (the tables a fingerprint covers
    and whose saves and deletes announce a new config version)."""
    from .models import ApiKey, EndpointCost, IdentityOverride, Plan, PlanAssignment, Rule

    return (Plan, PlanAssignment, ApiKey, Rule, EndpointCost, IdentityOverride)


@functools.cache
def _fingerprint_query(using, vendor, parts):
    """Return the ``(sql, params)`` of ``config_fingerprint``'s query on database ``using``
    for the tables of ``parts`` (a tuple of model names).

    Built once per process: the ORM takes about 4 ms to build and compile it, ten times what
    SQLite then takes to run it on the demo's rows.
    """
    from django.db.models import TextField, Value
    from django.db.models.functions import Cast

    tables = [(model, model._meta.concrete_fields) for model in config_models()
              if model._meta.model_name in parts]
    width = 1 + max(len(columns) for _, columns in tables)
    names = [f"fingerprint_{i}" for i in range(width)]
    queries = []
    for model, columns in tables:
        values = [Value(model._meta.db_table, output_field=TextField())]
        values += [Cast(column.attname, TextField()) for column in columns]
        values += [Value(None, output_field=TextField())] * (width - len(values))
        queries.append(model._default_manager.db_manager(using).order_by()
                       .annotate(**dict(zip(names, values))).values_list(*names))
    union = (queries[0].union(*queries[1:], all=True) if len(queries) > 1 else queries[0]).query
    # no ORDER BY at all: the first model's Meta.ordering would otherwise order the union by a
    # column it does not select, which Django 6.1 refuses ("ORDER BY term does not match any
    # column"); ``order_by()`` clears only explicit orderings, not the model's default one
    union.clear_ordering(force=True, clear_default=True)
    return union.sql_with_params()


def config_fingerprint(pause_s=0.0, parts=None):
    """Return a digest of the rows of each config table, ``{model name: hex str}``, in one
    database query (``parts``: the model names of the tables to read; default: all).

    Any change to those rows changes it: a ``save()``, but also what sends no signal (a
    queryset's ``update()``, ``bulk_create``, a data migration, raw SQL) and a ``delete()`` of a
    queryset. Workers compare it with the one their snapshot was compiled at, once every
    ``CONFIG_RELOAD_INTERVAL_S`` (``PolicyCache``).

    Why a content digest: ``update()`` and raw SQL leave ``auto_now`` columns alone, and an edit
    that deletes one row and adds another keeps the row count, so neither a count nor a latest
    timestamp would notice them. Every column of each table is read, not only those the
    snapshot uses today: a column compile_snapshot starts reading is then covered without
    anyone having to remember this function (an edit of a column it does not read costs one
    needless reload). The tables are read in one ``UNION ALL`` of text columns (each value
    cast to text by the database, so a digest is comparable only with digests from the same
    database, which is all it is used for; narrower tables padded to the widest) and the rows
    sorted here, the order of a union being undefined.

    With ``pause_s`` (the comparison thread's), the rows are read and hashed
    ``FINGERPRINT_CHUNK_ROWS`` at a time, sleeping ``pause_s`` between chunks: the reading and
    hashing hold the GIL (about 7 ms with the bench's 1,954 rows), and a request waiting for it
    would otherwise wait up to the interpreter's switch interval (5 ms) at a time. With pauses,
    it waits for one chunk at most.
    """
    from django.db import connections, router, transaction

    models = {model._meta.db_table: model._meta.model_name for model in config_models()}
    parts = tuple(sorted(models.values() if parts is None else parts))
    if not parts:
        return {}
    using = router.db_for_read(config_models()[0])
    sql, params = _fingerprint_query(using, connections[using].vendor, parts)
    # in a savepoint: should the query fail inside a request's transaction (ATOMIC_REQUESTS), the
    # database (PostgreSQL) would otherwise refuse every later query of that request
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = []
        while chunk := cursor.fetchmany(FINGERPRINT_CHUNK_ROWS):
            rows += chunk
            if pause_s:
                _pause(pause_s)
    # (table, primary key) is unique, so the sort never compares further columns (nor None
    # with text)
    rows.sort()
    # marshal's format 2 is exact (typed and length-prefixed: None apart from "") and has no
    # back-references, so equal rows give equal bytes; it is about 4x quicker than repr (0.7
    # vs 3.0 ms for the bench's 1,954 rows). Each chunk's bytes say where they end, so the
    # chunks' concatenation is as exact as the whole list's. Sorted, a table's rows are
    # contiguous: one digest per table, so a comparison says which tables changed.
    digests = {part: hashlib.blake2b(digest_size=16) for part in parts}
    for table, table_rows in itertools.groupby(rows, key=operator.itemgetter(0)):
        digest, table_rows = digests[models[table]], list(table_rows)
        for start in range(0, len(table_rows), FINGERPRINT_CHUNK_ROWS):
            digest.update(marshal.dumps(table_rows[start:start + FINGERPRINT_CHUNK_ROWS], 2))
            if pause_s:
                _pause(pause_s)
    return {part: digest.hexdigest() for part, digest in digests.items()}


# How long before a dated row's moment its snapshot is compiled (see PolicyCache.upcoming): far
# enough ahead that the compile is done when the moment comes, near enough that an edit seldom
# makes it wasted work.
UPCOMING_LEAD_S = 2.0


class PolicyCache:
    """A process's current snapshot, and how it stays fresh. The Limiter owns one.

    ``read_version`` returns the config version in the store (raising ``StoreUnavailable``
    when it cannot answer); ``load`` compiles a Snapshot of a version (default:
    ``compile_snapshot``, the database); ``clock`` is monotonic seconds, ``wall_clock`` epoch
    seconds (when dated rows start and end).

    Freshness rests on three parts (docs/howto/apply-edits.md says what they guarantee):

    - The fence: every debit carries the version its rules were compiled from, and take.lua
      debits nothing when the store holds another. The Limiter then asks ``fresh()`` for newer
      rules and decides again. So no decision debited in Redis after a version is published is
      made on older rules, even in a process that has not heard of the edit yet.
    - The watcher (``in_threads``, what a Limiter in a server runs): one thread that reads the
      version every ``watch_interval_s`` (one GET) and compiles a new version's rules at once,
      compiles the snapshot of a dated row's moment ahead of it, and compares the rows every
      ``reload_interval_s``, none of it waiting for a request. So the fence seldom fires, and a
      request seldom waits for a compile. A compile reads only the tables the versions since
      the snapshot's changed (``changes_since``, the store's record; see compile_snapshot).
    - Dated rows: a snapshot holds the rows active at its ``compiled_at`` and the next moment
      one starts or ends (``next_change_at``). The snapshot of that moment (``upcoming``) is
      compiled ahead, and swapped in by the first request at or after the moment or by the
      watcher, whichever comes first: a pointer swap, no compile.

    Without ``in_threads`` (tests, with their clocks and transactions) the request that finds
    it due polls the version (every ``check_interval_s``), reloads, compares the rows and
    switches at a dated moment. An edit made in this process (``invalidate()``: the commit of
    an admin save) is compiled in the next request either way, so the process that saved
    serves its edit at once; so is the first load.

    With ``reload_interval_s`` (None: off), the rows are compared with those the snapshot was
    compiled from through ``fingerprint`` (a digest, one query), for edits that send no signal
    (a queryset's ``update()``, raw SQL), one digest per table. On a difference
    ``announce(version, parts)`` writes a new version naming the tables that differ for every
    worker, unless another worker has announced this very change (it returns False then), and
    the worker whose announcement it was calls ``noticed`` (the audit trail's record): one
    record per change.
    """

    def __init__(self, read_version, *, check_interval_s, clock=time.monotonic,
                 load=None, reload_interval_s=None, fingerprint=None, announce=None,
                 wall_clock=time.time, noticed=None, in_threads=False,
                 watch_interval_s=0.05, poll_version=None, changes_since=None,
                 superseded=None):
        self._read_version = read_version
        # the watcher's read: straight to the store (its failures are not the requests')
        self._poll_store = poll_version or read_version
        self._poll_failed = False
        # ``changes_since(version, newest)``: the model names of the tables the versions
        # published after ``version`` up to ``newest`` changed (a set), or None when the store
        # cannot say (then everything is read)
        self._changes_since = changes_since
        # called as soon as a newer version is seen, before its compile: what the process
        # decides without Redis (the deny cache) must not outlive the rules (see Limiter)
        self._superseded = superseded
        # until then, a version key older than the snapshot's is a publication under way (the
        # snapshot was compiled as the version of a Cluster copy, see fresh): not a change
        self._ahead_until = 0.0
        # tables this process knows changed (its own edits, its comparison's findings) that no
        # compile has read since; None: unknown, everything
        self._pending_parts = set()
        self._wall_clock = wall_clock
        # the compile and the digest of the rows, when a test gives its own (see _load, _digest)
        self._given_load, self._given_fingerprint = load, fingerprint
        self.check_interval_s = check_interval_s
        self.reload_interval_s = reload_interval_s
        self.watch_interval_s = watch_interval_s
        self._announce = announce
        self._noticed = noticed
        self._clock = clock
        self._lock = threading.Lock()          # one compile at a time
        self._swap_lock = threading.Lock()     # installing a snapshot (never held to compile)
        self._compare_lock = threading.Lock()  # one comparison at a time
        self.snapshot = None
        self.upcoming = None     # the snapshot of snapshot.next_change_at, compiled ahead
        self.fingerprint = None  # digests of the rows the snapshot was compiled from
        self.last_compile = ""   # what the last compile read: "everything", or its parts
        self.stale = True
        self.checked_at = 0.0  # clock time the version was last confirmed
        self.retry_at = 0.0    # after a failed load: clock time the DB may be tried again
        self.compare_at = math.inf  # clock time the rows are next compared with the snapshot
        self.switch_at = math.inf   # clock time a dated row may start or end (see _schedule)
        self.due_at = math.inf      # what the request path compares with (see _set_due)
        # invalidate() calls so far, and how many of them the last reload covered; and a
        # dated moment passed with no upcoming snapshot ready: both reload in the request
        self._edits_here = self._edits_reloaded = 0
        self._moment_missed = False
        self._watcher = (WorkerThread(self._watch, "ratelimit-config-watcher",
                                      every_s=self._until_next_watch)
                         if in_threads else None)

    def _load(self, version, pause_s=0.0, at=None, base=None, changed=None):
        """Compile the rows into a snapshot of ``version`` as they apply at ``at`` (epoch s;
        default: now), pausing ``pause_s`` between chunks of rows; with ``base``, reading only
        the parts the tables ``changed`` feed (see compile_snapshot)."""
        if self._given_load is not None:
            return self._given_load(version) if at is None else self._given_load(version, at=at)
        return compile_snapshot(version, self._wall_clock() if at is None else at, pause_s,
                                base=base, changed=changed)

    def _digest(self, pause_s=0.0, parts=None):
        """Return the digests of the rows (``config_fingerprint``), pausing as ``_load`` does:
        of every table, or of ``parts`` merged into the current ones."""
        if self._given_fingerprint is not None:
            return self._given_fingerprint()
        if parts is None or not isinstance(self.fingerprint, dict):
            return config_fingerprint(pause_s=pause_s)
        return {**self.fingerprint, **config_fingerprint(pause_s=pause_s, parts=parts)}

    @property
    def watching(self):
        """True while the watcher thread runs (False without ``in_threads``)."""
        return self._watcher is not None and self._watcher.running

    def close(self):
        """Stop the watcher thread, if it runs."""
        if self._watcher is not None:
            self._watcher.stop()

    def invalidate(self, parts=None):
        """Reload at the next request (in the request, also with ``in_threads``), keeping the
        current rules if the reload fails. ``parts``: the model names of the tables the edit
        changed (None: unknown)."""
        self._note_changed(parts)
        self._edits_here += 1
        self.stale = True

    def _note_changed(self, parts):
        """Remember that the tables of ``parts`` (None: unknown ones) changed."""
        if parts is None or self._pending_parts is None:
            self._pending_parts = None
        else:
            self._pending_parts = self._pending_parts | set(parts)

    @property
    def reload_here(self):
        """True when the next request must compile itself rather than leave it to the watcher:
        after an edit made in this process that no reload has covered yet, or a dated moment
        that passed before its snapshot was ready."""
        return self._edits_here != self._edits_reloaded or self._moment_missed

    def reset(self):
        """Drop the snapshot; the next request compiles a new one."""
        with self._lock:
            self.snapshot = self.upcoming = None
            self.fingerprint = None
            self.stale = True
            self.retry_at = 0.0

    def confirmed_recently(self):
        """True when the store confirmed the snapshot's version within two watcher rounds (with
        no watcher: within ``check_interval_s``): what a decision made without Redis, which
        the fence cannot catch, needs to be made on rules that are still the published ones.
        So a watcher held up by a busy machine delays no edit's effect on local refusals."""
        window = 2 * self.watch_interval_s if self._watcher is not None \
            else self.check_interval_s
        return not self.stale and self._clock() - self.checked_at <= window

    def observe_version(self, version):
        """Record the config version a store reply carried (None: the reply had none); any
        difference from the snapshot's, up or down, makes the snapshot stale."""
        if version is None:
            return
        self.checked_at = self._clock()
        snapshot = self.snapshot
        if snapshot is not None and version != snapshot.version:
            self._mark_superseded()

    # --- the request path --------------------------------------------------------------------

    def get(self):
        """Return the current snapshot, reloading it if the config version or the rows
        changed, or switching to the next one at a dated row's moment."""
        snapshot = self.snapshot
        if snapshot is not None and not self.stale:
            now = self._clock()
            if now - self.checked_at < self.check_interval_s and now < self.due_at:
                return snapshot
            snapshot = self._due(snapshot, now)
            if not self.stale:
                return snapshot
        if snapshot is not None and self._clock() < self.retry_at:
            return snapshot  # the last load failed moments ago; replies keep marking it stale
        if self._leaves_to_watcher(snapshot):
            return snapshot
        return self._reload()

    def current(self):
        """Return the snapshot ``get()`` would return without reading the store or the
        database, or None when it has to (the async path then runs ``get`` in a thread)."""
        snapshot = self.snapshot
        if snapshot is None:
            return None
        now = self._clock()
        if not self.stale:
            if now < self.due_at and now - self.checked_at < self.check_interval_s:
                return snapshot
            if now >= self.switch_at:
                snapshot = self._switch_if_due(snapshot, now)
                if not self.stale and now < self.due_at and \
                        now - self.checked_at < self.check_interval_s:
                    return snapshot
            if not self.stale:
                return None  # a poll or a comparison is due
        if now < self.retry_at or self._leaves_to_watcher(snapshot):
            return snapshot
        return None

    def _due(self, snapshot, now):
        """What ``get`` does when the snapshot may be out of date: switch at a dated moment,
        compare the rows (without a watcher), poll the version. Returns the snapshot to serve
        unless it turned stale."""
        if now >= self.switch_at:
            snapshot = self._switch_if_due(snapshot, now)
        if not self.stale and self._watcher is None and now >= self.compare_at:
            self._compare_rows(snapshot, now)
        if not self.stale and now - self.checked_at >= self.check_interval_s:
            if self._watcher is not None:
                self._watcher.ensure_running()  # e.g. in a child forked after it started
            self._poll_version(snapshot)
        return snapshot

    def _leaves_to_watcher(self, snapshot):
        """Wake the watcher and return True when the stale ``snapshot`` may be served until
        the watcher has compiled the new one: the fence refuses its debits meanwhile."""
        if self._watcher is None or snapshot is None or self.reload_here:
            return False
        self._watcher.wake()
        return True

    def fresh(self, superseded, version=None):
        """Return rules newer than ``superseded``, a snapshot a fenced call found out of date:
        those the watcher installed meanwhile (a compile under way is waited for), or compiled
        now, as ``version`` (default: the version the store holds)."""
        with self._lock:
            current = self.snapshot
            if current is not None and (current.version != superseded.version
                                        or self._clock() < self.retry_at):
                return current  # newer; or the last compile failed moments ago
            self.stale = True
            if version is not None:
                self._ahead_until = self._clock() + PUBLICATION_WAIT_S
            return self._reload_locked(version=version)

    # --- the watcher -------------------------------------------------------------------------

    def _until_next_watch(self):
        """Seconds until the watcher's next round: its poll, a dated moment, or a comparison."""
        now = self._clock()
        # while the store cannot answer, poll as seldom as the request path would
        interval = self.check_interval_s if self._poll_failed else self.watch_interval_s
        wait = min(interval, self.switch_at - now,
                   self.compare_at - now if self.reload_interval_s else math.inf)
        return max(wait, 0.001)

    def _watch(self):
        """One round of the watcher: poll the version, reload, switch at a dated moment,
        compile the next moment's snapshot, compare the rows (each when due)."""
        snapshot = self.snapshot
        if snapshot is None:
            return
        try:
            version = self._poll_store()
        except StoreUnavailable:
            self._poll_failed = True  # keep the rules, poll less often until it answers
        else:
            self._poll_failed = False
            self.checked_at = self._clock()
            if version != snapshot.version and not self._ahead_of(version, snapshot):
                self._mark_superseded()
        # (compiles for the rules in force are never paced: once a version is published, each
        # request's debit is fenced until the new rules are in, so a pause would only make it
        # wait longer; with one table read again they are milliseconds of CPU)
        if self.stale and self._clock() >= self.retry_at:
            self._reload()
        now = self._clock()
        if now >= self.switch_at:
            self._switch_if_due(self.snapshot, now)
            if self.stale:
                self._reload()
        self._prepare_upcoming(self.snapshot)
        if self.reload_interval_s and now >= self.compare_at and not self.stale:
            with self._compare_lock:
                self.compare_at = now + self.reload_interval_s
                self._compare_with(self.snapshot, pause_s=COMPARISON_PAUSE_S)

    def _prepare_upcoming(self, snapshot):
        """Compile the snapshot of ``snapshot.next_change_at`` once the moment is less than
        UPCOMING_LEAD_S away (kept in ``upcoming`` until the moment)."""
        if snapshot is None or snapshot.next_change_at == math.inf:
            return
        moment = snapshot.next_change_at
        upcoming = self.upcoming
        if upcoming is not None and upcoming.version == snapshot.version \
                and upcoming.compiled_at == moment:
            return
        if moment - self._wall_clock() > UPCOMING_LEAD_S:
            return
        try:
            # the dated parts only: the other rows are those of ``snapshot``
            upcoming = self._load(snapshot.version, RELOAD_PAUSE_S, at=moment,
                                  base=snapshot, changed=set())
        except Exception:  # a DB outage: the request at the moment compiles instead
            logger.exception("ratelimit_app: could not compile the rules of a dated row's "
                             "moment ahead of it")
            return
        upcoming.compiled_at = moment
        self.upcoming = upcoming

    # --- dated rows --------------------------------------------------------------------------

    def _switch_if_due(self, snapshot, now):
        """At ``switch_at``: install the upcoming snapshot if the wall clock has reached the
        moment (or mark the rules stale, to be compiled in the request, when it is not ready),
        else set the deadline again from the wall clock (it was only a recheck). Returns the
        snapshot to serve."""
        if self._wall_clock() < snapshot.next_change_at:
            self._schedule(snapshot, now)
            return snapshot
        upcoming = self.upcoming
        with self._swap_lock:
            if self.snapshot is not snapshot:
                return self.snapshot  # another thread switched (or reloaded) meanwhile
            if upcoming is not None and upcoming.version == snapshot.version \
                    and upcoming.compiled_at == snapshot.next_change_at:
                self.snapshot, self.upcoming = upcoming, None
                self._schedule(upcoming, now)
                return upcoming
        logger.info("ratelimit_app: a dated plan assignment or identity override starts or "
                    "ends now; reloading the rules")
        self._moment_missed = True
        self.stale = True
        return snapshot

    def _schedule(self, snapshot, now):
        """Set the monotonic deadline of ``snapshot.next_change_at`` (a wall-clock time), at
        most SCHEDULE_RECHECK_S ahead of ``now``."""
        if snapshot.next_change_at == math.inf:
            self.switch_at = math.inf  # no dated row ahead: nothing to recheck
        else:
            remaining = snapshot.next_change_at - self._wall_clock()
            self.switch_at = now + min(max(remaining, 0.0), SCHEDULE_RECHECK_S)
        self._set_due()

    def _set_due(self):
        # the request path compares the rows only where no watcher does
        self.due_at = self.switch_at if self._watcher is not None \
            else min(self.compare_at, self.switch_at)

    # --- the version and the rows ------------------------------------------------------------

    def _version_or(self, fallback):
        try:
            return self._read_version()
        except StoreUnavailable:
            return fallback

    def _poll_version(self, snapshot):
        self.checked_at = self._clock()
        version = self._version_or(None)  # None: keep serving the rules we have
        if version is not None and version != snapshot.version \
                and not self._ahead_of(version, snapshot):
            self._mark_superseded()

    def _ahead_of(self, version, snapshot):
        """True when ``snapshot`` was compiled as a publication under way, moments ago, that
        the version key (``version``) has not caught up with yet."""
        return self._clock() < self._ahead_until and \
            published_ms(version) < published_ms(snapshot.version)

    def _mark_superseded(self):
        """The store holds another version than the snapshot's: compile, and meanwhile decide
        nothing without Redis on the old rules."""
        if not self.stale and self._superseded is not None:
            self._superseded()
        self.stale = True

    def _compare_rows(self, snapshot, now):
        """At ``compare_at`` (no watcher): set the next one, and compare the rows with those
        ``snapshot`` was compiled from."""
        if not self._compare_lock.acquire(blocking=False):
            return  # another thread compares: serve ``snapshot`` meanwhile
        try:
            if now < self.compare_at or snapshot is not self.snapshot:
                return  # another thread compared (or reloaded) while this one got here
            self.compare_at = now + self.reload_interval_s
            self._set_due()
            self._compare_with(snapshot)
        finally:
            self._compare_lock.release()

    def _compare_with(self, snapshot, pause_s=0.0):
        """Compare the rows with those ``snapshot`` was compiled from (one query, see _digest);
        on a difference, mark it stale and announce a new version."""
        expected = self.fingerprint
        try:
            fingerprint = self._digest(pause_s)
        except Exception:  # a DB outage must not turn into 500s: keep the rules we have
            logger.exception("ratelimit_app: could not compare the quota rows with the "
                             "rules in memory")
            return
        if fingerprint == expected or snapshot is not self.snapshot:
            return  # unchanged, or reloaded meanwhile (from rows at least as new)
        parts = _changed_parts(expected, fingerprint)
        self._note_changed(parts)
        if self._watcher is None:
            self._announce_change(snapshot, parts)
            self.stale = True  # the request reloads next
            return
        # the watcher holds the compile's lock from before the announcement: a request whose
        # debit the new version fences waits for this compile instead of compiling its own
        with self._lock:
            self._announce_change(snapshot, parts)
            self.stale = True
            self._reload_locked()

    def _announce_change(self, snapshot, parts):
        """Announce that the rows of ``snapshot`` changed (in the tables of ``parts``; None:
        unknown), unless another worker has (or the store cannot say); before the snapshot is
        marked stale, so that this worker's reload reads the new version, not the old one it
        would reload again at the next poll."""
        if self._version_or(None) == snapshot.version and \
                self._announce_new_version(snapshot.version, parts):
            logger.info("ratelimit_app: quota rows changed without an announced version (a "
                        "queryset update(), bulk_create, raw SQL, a migration); reloading and "
                        "announcing a new version to every worker")
            if self._noticed is not None:
                self._noticed()

    def _announce_new_version(self, superseded, parts):
        """Announce that the rows of version ``superseded`` changed; return True when this
        worker's announcement was the one that counted."""
        if self._announce is None:
            return False
        try:
            return self._announce(superseded, parts)
        except StoreUnavailable as exc:
            logger.error("ratelimit_app: quota rows changed, but Redis is unavailable to tell "
                         "the other workers (%s); each notices within CONFIG_RELOAD_INTERVAL_S",
                         exc)
            return False

    # --- compiling ---------------------------------------------------------------------------

    def _reload(self, pause_s=0.0):
        with self._lock:
            if self.snapshot is not None and not self.stale:
                return self.snapshot  # another thread reloaded while we waited
            return self._reload_locked(pause_s)

    def _reload_locked(self, pause_s=0.0, version=None):
        # an edit of this process during the reload may have committed after the rows were
        # read: it then still reloads in the next request
        edits_seen = self._edits_here
        pending, self._pending_parts = self._pending_parts, set()
        if version is None:
            # "unknown" differs from any real version: reload once the store answers
            version = self._version_or("unknown")
        base = self.snapshot if self.fingerprint is not None or not self.reload_interval_s \
            else None  # (no fingerprint: no snapshot yet, or one of a failed load)
        changed = self._changed_since(base, pending, version)
        try:
            # the digest before the rows: a change landing between the two then makes the
            # next comparison reload once more, rather than hide behind a newer digest
            fingerprint = self._digest(pause_s, changed) if self.reload_interval_s else None
            snapshot = self._load(version, pause_s, base=base, changed=changed)
        except Exception:  # a DB outage must not turn into 500s: keep the old rules
            logger.exception("ratelimit_app: could not load the quota configuration")
            self._note_changed(pending)
            if self.snapshot is None:
                self.snapshot = Snapshot(version="unknown")
            # try again at the next version poll, not on every request
            self.stale = False
            self._edits_reloaded = self._edits_here
            self._moment_missed = False
            self.checked_at = self._clock()
            self.retry_at = self.checked_at + self.check_interval_s
            return self.snapshot
        with self._swap_lock:
            self.snapshot, self.fingerprint = snapshot, fingerprint
            self.last_compile = "everything" if changed is None else sorted(changed)
            if self.upcoming is not None and self.upcoming.version != version:
                self.upcoming = None
            self._edits_reloaded = edits_seen
            self._moment_missed = False
            self.stale = self.reload_here
            self.checked_at = self._clock()
            self.compare_at = (self.checked_at + self.reload_interval_s
                               if self.reload_interval_s else math.inf)
            self._schedule(snapshot, self.checked_at)
        if self._watcher is not None:
            self._watcher.ensure_running()
        return snapshot

    def _changed_since(self, base, pending, version):
        """Return the model names of the tables changed since ``base`` was compiled, up to
        ``version`` (what the published versions say, and ``pending``), or None when that
        cannot be known: no ``base``, a store that cannot say, a version older than its record
        of changes or not in it."""
        if base is None or pending is None or self._changes_since is None \
                or base.version == "unknown":
            return None
        if version == base.version:
            return set(pending)
        try:
            logged = self._changes_since(base.version, version)
        except StoreUnavailable:
            return None
        return None if logged is None else logged | pending


def _changed_parts(expected, found):
    """Return the model names whose digests differ between two fingerprints, or None when they
    cannot be compared table by table."""
    if not (isinstance(expected, dict) and isinstance(found, dict)):
        return None
    return {part for part in expected.keys() | found.keys()
            if expected.get(part) != found.get(part)}
