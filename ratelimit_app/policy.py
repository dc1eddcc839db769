"""DB rows → an immutable in-process snapshot, reloaded when the config version in Redis changes.

The request path reads only the snapshot: no database query per request once it is warm. Every
committed admin change writes a new version (``signals.py``); a worker notices it in the reply of
its next Lua call (the script returns it for free), or by asking the store when it has not made
a call for ``CONFIG_CHECK_INTERVAL_S``, and reloads (``PolicyCache``, owned by the Limiter).

Rows changed without a signal (a queryset's ``update()``, ``bulk_create``, raw SQL, a data
migration) announce nothing: for them each worker compares a digest of the rows with its
snapshot's once every ``CONFIG_RELOAD_INTERVAL_S`` (one query, ``config_fingerprint``), and the
first to see a difference reloads and announces a new version, so the others follow within
about a second.

Plan assignments, identity overrides and the plan of an API key may have a start and an end
(``models.Scheduled``): a snapshot holds only the rows active when it was compiled, and the
next moment one starts or ends (``Snapshot.next_change_at``); each worker recompiles at that
moment by itself, with no announcement and no query before it (``PolicyCache``).
"""

import functools
import hashlib
import logging
import marshal
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .background import WorkerThread
from .conf import get_config

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
    # alert thresholds, percent of the quota used, ascending (see alerts.py); (): no alerts
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
    has_alerts: bool = False       # a rule has alert thresholds (see alerts.py)
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


def compile_snapshot(version, now=None, pause_s=0.0):
    """Read every configuration row and return a Snapshot (the only DB access of the app).

    ``now`` (epoch s; default: the wall clock) picks the dated assignments and overrides
    that are active; the snapshot records when the next one starts or ends. With ``pause_s``
    (the reload thread's), it sleeps that long after every ``FINGERPRINT_CHUNK_ROWS`` rows it
    builds, for the reason ``config_fingerprint`` does (the GIL; see ``_paced``).

    The reads run in an atomic block of their own: inside a caller's transaction (a view under
    ATOMIC_REQUESTS, a management command) that is a savepoint, so a failed read (a table being
    migrated) is rolled back alone instead of aborting the caller's transaction on PostgreSQL.
    """
    from django.db import router, transaction

    from .models import Rule

    with transaction.atomic(using=router.db_for_read(Rule)):
        return _read_snapshot(version, now, pause_s)


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
            time.sleep(pause_s)


def _rows(queryset, *fields, pause_s=0.0):
    """Return ``queryset``'s rows as named tuples of ``fields`` (paced, see _paced). Tuples,
    not model instances: a compile of the bench's rows then takes 11 ms instead of 33 ms, and
    every worker compiles at every edit."""
    return list(_paced(queryset.values_list(*fields, named=True), pause_s))


def _read_snapshot(version, now, pause_s=0.0):
    from .identity import limited_ip
    from .models import (ApiKey, Counts, EndpointCost, FailureMode, IdentityOverride, Kind, Mode,
                         Plan, PlanAssignment, Rule, active_at, parse_alert_thresholds)

    moment = datetime.fromtimestamp(time.time() if now is None else now, tz=timezone.utc)

    plans = _rows(Plan.objects.all(), "slug", "default_for_authenticated",
                  "default_for_anonymous", pause_s=pause_s)
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
    assignment_rows = _rows(PlanAssignment.objects.all(), "user_id", "plan__slug", "tenant",
                            "starts_at", "ends_at", pause_s=pause_s)
    assignments = {
        str(a.user_id): (a.plan__slug, a.tenant)
        for a in assignment_rows if active_at(a.starts_at, a.ends_at, moment)
    }
    key_rows = _rows(ApiKey.objects.filter(active=True), "id", "digest", "prefix", "user_id",
                     "plan_id", "plan__slug", "tenant", "starts_at", "ends_at", pause_s=pause_s)
    # a key's plan outside its dates is None: the key is on its user's plan meanwhile
    api_keys = {
        k.digest: ApiKeyEntry(k.id, k.prefix, str(k.user_id),
                              k.plan__slug if k.plan_id and active_at(k.starts_at, k.ends_at,
                                                                      moment) else None,
                              k.tenant)
        for k in key_rows
    }
    overrides = {}
    override_rows = _rows(IdentityOverride.objects.order_by("id"), "user_id", "api_key_id", "ip",
                          "exempt", "rule_id", "rate", "period_s", "burst", "starts_at",
                          "ends_at", pause_s=pause_s)
    # the dated ones after the permanent ones: the engine applies them in order, the last wins
    active = sorted((o for o in override_rows if active_at(o.starts_at, o.ends_at, moment)),
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
    costs = {
        (c.endpoint, c.method, c.plan__slug): c.cost
        for c in _rows(EndpointCost.objects.all(), "endpoint", "method", "plan__slug", "cost",
                       pause_s=pause_s)
    }
    return Snapshot(
        version=version,
        rules=rules,
        failed_auth_rules=tuple(r for r in rules if r.failed_auth),
        has_alerts=any(r.alerts for r in rules),
        plans=frozenset(p.slug for p in plans),
        default_authenticated_plan=next((p.slug for p in plans if p.default_for_authenticated), None),
        default_anonymous_plan=next((p.slug for p in plans if p.default_for_anonymous), None),
        api_keys=api_keys,
        assignments=assignments,
        overrides={k: tuple(v) for k, v in overrides.items()},
        costs=costs,
        next_change_at=min(_next_change(assignment_rows, moment),
                           _next_change(override_rows, moment),
                           _next_change([k for k in key_rows if k.plan_id], moment)),
    )


# config_fingerprint reads and hashes this many rows at a time (see its pause_s), and the reload
# thread's compile_snapshot builds this many between pauses: a few tenths of a millisecond of
# CPU; and the pause of the comparison and reload threads after each chunk, in which a request
# thread can take the GIL. The thread is idle most of the time (with the bench's 1,954 rows a
# comparison lasts about 100 ms, for 12.6 ms of CPU against 7.3 ms in one go), so a request
# that gives the GIL up for a moment (each call to Redis, each write to its client) seldom
# finds it taken on return.
FINGERPRINT_CHUNK_ROWS = 50
COMPARISON_PAUSE_S = 0.001
# The reload thread's pause, longer: it runs at normal priority (a reload is due within about a
# second, even on a busy machine; and a thread of low priority holding the GIL would hold up
# the requests waiting for it), so its share of its worker's GIL is kept down by pausing
# instead: with 3 ms after each chunk of a few tenths of a millisecond, at most about 10 %.
# With the bench's 1,954 rows a reload (digest and compile) then lasts about 0.4 s, for 28 ms
# of CPU (26 ms in one go; 51 ms while the compile built model instances). Measured with a
# config edit every second at 1,250 req/s (gunicorn, 2 sync workers), with model instances:
# ours' p99 40 ms compiling in the request, 22 ms in the thread pausing 1 ms, 8-10 ms pausing
# 3 ms; at 1,100 req/s, two servers side by side, 13-19 ms with model instances and 8-9 ms with
# tuples (docs/howto/apply-edits.md).
RELOAD_PAUSE_S = 0.003


def config_models():
    """Return the models whose rows ``compile_snapshot`` reads (the tables a fingerprint covers
    and whose saves and deletes announce a new config version)."""
    from .models import ApiKey, EndpointCost, IdentityOverride, Plan, PlanAssignment, Rule

    return (Plan, PlanAssignment, ApiKey, Rule, EndpointCost, IdentityOverride)


@functools.cache
def _fingerprint_query(using, vendor):
    """Return the ``(sql, params)`` of ``config_fingerprint``'s query on database ``using``.

    Built once per process: the ORM takes about 4 ms to build and compile it, ten times what
    SQLite then takes to run it on the demo's rows.
    """
    from django.db.models import TextField, Value
    from django.db.models.functions import Cast

    tables = [(model, model._meta.concrete_fields) for model in config_models()]
    width = 1 + max(len(columns) for _, columns in tables)
    names = [f"fingerprint_{i}" for i in range(width)]
    queries = []
    for model, columns in tables:
        values = [Value(model._meta.db_table, output_field=TextField())]
        values += [Cast(column.attname, TextField()) for column in columns]
        values += [Value(None, output_field=TextField())] * (width - len(values))
        queries.append(model._default_manager.db_manager(using).order_by()
                       .annotate(**dict(zip(names, values))).values_list(*names))
    union = queries[0].union(*queries[1:], all=True).query
    # no ORDER BY at all: the first model's Meta.ordering would otherwise order the union by a
    # column it does not select, which Django 6.1 refuses ("ORDER BY term does not match any
    # column"); ``order_by()`` clears only explicit orderings, not the model's default one
    union.clear_ordering(force=True, clear_default=True)
    return union.sql_with_params()


def config_fingerprint(pause_s=0.0):
    """Return a digest (hex str) of every row of every config table, in one database query.

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

    using = router.db_for_read(config_models()[0])
    sql, params = _fingerprint_query(using, connections[using].vendor)
    # in a savepoint: should the query fail inside a request's transaction (ATOMIC_REQUESTS), the
    # database (PostgreSQL) would otherwise refuse every later query of that request
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = []
        while chunk := cursor.fetchmany(FINGERPRINT_CHUNK_ROWS):
            rows += chunk
            if pause_s:
                time.sleep(pause_s)
    # (table, primary key) is unique, so the sort never compares further columns (nor None
    # with text)
    rows.sort()
    # marshal's format 2 is exact (typed and length-prefixed: None apart from "") and has no
    # back-references, so equal rows give equal bytes; it is about 4x quicker than repr (0.7
    # vs 3.0 ms for the bench's 1,954 rows). Each chunk's bytes say where they end, so the
    # chunks' concatenation is as exact as the whole list's.
    digest = hashlib.blake2b(digest_size=16)
    for start in range(0, len(rows), FINGERPRINT_CHUNK_ROWS):
        digest.update(marshal.dumps(rows[start:start + FINGERPRINT_CHUNK_ROWS], 2))
        if pause_s:
            time.sleep(pause_s)
    return digest.hexdigest()


class PolicyCache:
    """A process's current snapshot and what it knows about the config version in the store.

    ``read_version`` is a callable returning the version string (raising ``StoreUnavailable``
    when the store cannot answer); ``load`` compiles a Snapshot for a version (the database);
    ``clock`` is monotonic seconds. The Limiter owns one.

    ``wall_clock`` (epoch seconds) is read only when a snapshot is compiled and when its
    ``next_change_at`` (a dated assignment or override starting or ending) may be due: that
    moment is turned into a monotonic deadline folded into the one the request path already
    compares with, so a dated row costs a request nothing, and the worker recompiles at the
    first request after the moment.

    With ``reload_interval_s`` (None: off), the rows are also compared with the snapshot once
    per interval through ``fingerprint`` (a callable returning a digest of the rows, one
    query); on a difference the snapshot is reloaded and ``announce`` (a callable writing a new
    version for every worker) is called, unless the store's version has already moved on; then
    ``noticed`` (the audit trail's record of the change) is called too.

    Where that comparison runs: with ``in_threads`` (what a Limiter in a server does), in a
    thread of its own (``background.WorkerThread``: database connections of its own, closed
    after each comparison; the lowest CPU priority), which the request that finds it due
    wakes and does not wait for. The query and the digest take milliseconds of CPU (about
    7 ms with the bench's 1,954 rows, more on a loaded machine): on a request's path they held
    up that request and, on a sync worker, every request queued behind it (ours' p99 at a
    fixed rate was 0.6 ms above the bare Lua throttle's with it there, level with it
    without). The thread reads and hashes in chunks with pauses (``config_fingerprint``), so a
    request wanting the GIL back seldom waits for it. Without ``in_threads`` (tests, whose
    rows are in a transaction no other connection sees, and whose test clock decides when it
    is due), the request that finds it due compares. Either way one comparison at a time, and
    the other requests serve the snapshot meanwhile. The version poll stays on the request
    path: it is one Redis GET.

    Where a reload runs: with ``in_threads``, a change this process learns of from elsewhere
    (a new version in a reply or at the poll, rows that changed, a dated row starting or
    ending) is compiled in a second thread, at normal priority (a reload must not wait behind
    a busy machine's requests: the edit is due within about a second), while the requests
    keep serving the rules in memory. A reload (digest and compile) of the bench's 1,954 rows
    takes about 26 ms of CPU (51 ms before the compile read tuples), which a request, and on a
    sync worker every request queued behind it, used to wait; the thread paces itself
    (``RELOAD_PAUSE_S``). An edit made
    in this process (``invalidate()``: the commit of an admin save announces it) reloads in the
    next request, as without threads, so the process that saved serves its edit at once; so
    does the first load (there are no rules to serve meanwhile).
    """

    def __init__(self, read_version, *, check_interval_s, clock=time.monotonic,
                 load=None, reload_interval_s=None, fingerprint=None, announce=None,
                 wall_clock=time.time, noticed=None, in_threads=False):
        self._read_version = read_version
        self._wall_clock = wall_clock
        # the compile and the digest of the rows, when a test gives its own (see _load, _digest)
        self._given_load, self._given_fingerprint = load, fingerprint
        self.check_interval_s = check_interval_s
        self.reload_interval_s = reload_interval_s
        self._announce = announce
        self._noticed = noticed  # called once this worker announced rows changed unannounced
        self._clock = clock
        self._lock = threading.Lock()
        self._compare_lock = threading.Lock()
        self.snapshot = None
        self.fingerprint = None  # digest of the rows the snapshot was compiled from
        self.stale = True
        self.checked_at = 0.0  # clock time the version was last confirmed
        self.retry_at = 0.0    # after a failed load: clock time the DB may be tried again
        self.compare_at = math.inf  # clock time the rows are next compared with the snapshot
        self.switch_at = math.inf   # clock time a dated row may start or end (see _schedule)
        self.due_at = math.inf      # the earlier of the two: the request path compares only it
        # invalidate() calls so far, and how many of them the last reload covered (see
        # reload_here and _reload)
        self._edits_here = self._edits_reloaded = 0
        self._row_comparison = (WorkerThread(self._compare_current_rows,
                                             "ratelimit-row-comparison", low_priority=True)
                                if in_threads else None)
        self._reloader = (WorkerThread(self._reload_if_stale, "ratelimit-rules-reload")
                          if in_threads else None)

    def _load(self, version, pause_s=0.0):
        """Compile the rows into a snapshot of ``version``; a thread passes its pause
        (COMPARISON_PAUSE_S, RELOAD_PAUSE_S: it yields the GIL between chunks of rows)."""
        if self._given_load is not None:
            return self._given_load(version)
        return compile_snapshot(version, self._wall_clock(), pause_s)

    def _digest(self, pause_s=0.0):
        """Return the digest of the rows (``config_fingerprint``), pausing as ``_load`` does."""
        if self._given_fingerprint is not None:
            return self._given_fingerprint()
        return config_fingerprint(pause_s=pause_s)

    def close(self):
        """Stop the comparison and reload threads, if they run."""
        for thread in (self._row_comparison, self._reloader):
            if thread is not None:
                thread.stop()

    def invalidate(self):
        """Reload at the next request (in the request, also with ``in_threads``), keeping the
        current rules if the reload fails."""
        self._edits_here += 1
        self.stale = True

    @property
    def reload_here(self):
        """True after an edit made in this process that no reload has covered yet: the next
        request reloads itself rather than leave it to the reload thread."""
        return self._edits_here != self._edits_reloaded

    def reset(self):
        """Drop the snapshot; the next request compiles a new one."""
        with self._lock:
            self.snapshot = None
            self.fingerprint = None
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
        """Return the current snapshot, reloading it if the config version or the rows
        changed."""
        snapshot = self.snapshot
        if snapshot is not None and not self.stale:
            now = self._clock()
            if now - self.checked_at < self.check_interval_s and now < self.due_at:
                return snapshot
            if now >= self.switch_at:
                self._check_schedule(snapshot, now)
            if not self.stale and now >= self.compare_at:
                self._compare_rows(snapshot, now)
            if not self.stale and now - self.checked_at >= self.check_interval_s:
                self._poll_version(snapshot)
            if not self.stale:
                return snapshot
        if snapshot is not None and self._clock() < self.retry_at:
            return snapshot  # the last load failed moments ago; replies keep marking it stale
        if self._reloads_in_thread(snapshot):
            return snapshot
        return self._reload()

    def _reloads_in_thread(self, snapshot):
        """Wake the reload thread and return True when the stale ``snapshot`` may be served
        until the thread has compiled the new one (see the class's docstring)."""
        if self._reloader is None or snapshot is None or self.reload_here:
            return False
        self._reloader.wake()
        return True

    def _reload_if_stale(self):
        """The reload thread's work."""
        if self.stale:
            self._reload(in_thread=True)

    def current(self):
        """Return the snapshot ``get()`` would return without reading the store or the
        database, or None when it has to (the async path then runs ``get`` in a thread)."""
        snapshot = self.snapshot
        if snapshot is None:
            return None
        now = self._clock()
        if not self.stale:
            if now - self.checked_at < self.check_interval_s and now < self.due_at:
                return snapshot
            if self._row_comparison is not None and now < self.switch_at \
                    and now - self.checked_at < self.check_interval_s:
                self._compare_rows(snapshot, now)  # only wakes the thread
                return snapshot
            return None
        if now < self.retry_at or self._reloads_in_thread(snapshot):
            return snapshot
        return None

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

    def _compare_rows(self, snapshot, now):
        """At ``compare_at``: set the next one, and compare the rows with those ``snapshot``
        was compiled from, in the comparison thread (woken, not waited for) or here."""
        if not self._compare_lock.acquire(blocking=False):
            return  # another thread compares: serve ``snapshot`` meanwhile
        try:
            if now < self.compare_at or snapshot is not self.snapshot:
                return  # another thread compared (or reloaded) while this one got here
            self.compare_at = now + self.reload_interval_s
            self.due_at = min(self.compare_at, self.switch_at)
            if self._row_comparison is None:
                self._compare_with(snapshot)
        finally:
            self._compare_lock.release()
        if self._row_comparison is not None:
            # the reload thread is started here, by a request's thread, at normal priority
            self._reloader.ensure_running()
            self._row_comparison.wake()

    def _compare_current_rows(self):
        """The comparison thread's work: compare the rows with the current snapshot's."""
        snapshot = self.snapshot
        if snapshot is not None and not self.stale:
            with self._compare_lock:
                self._compare_with(snapshot, pause_s=COMPARISON_PAUSE_S)

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
        # announced before the snapshot is marked stale, so that this worker's reload (in a
        # request, maybe while the thread is still here) reads the new version, not the old
        # one it would reload again at the next version poll; unless another worker announced
        # it already (or the store cannot say)
        if self._version_or(None) == snapshot.version:
            logger.info("ratelimit_app: quota rows changed without an announced version (a "
                        "queryset update(), bulk_create, raw SQL, a migration); reloading and "
                        "announcing a new version to every worker")
            self._announce_new_version()
            if self._noticed is not None:
                self._noticed()
        self.stale = True
        if self._reloader is not None and self._reloader.running:
            # no request needs to come first; but never started from here: on Linux a thread
            # inherits the nice value of the thread that starts it (19 here)
            self._reloader.wake()

    def _announce_new_version(self):
        from .stores import StoreUnavailable

        if self._announce is None:
            return
        try:
            self._announce()
        except StoreUnavailable as exc:
            logger.error("ratelimit_app: quota rows changed, but Redis is unavailable to tell "
                         "the other workers (%s); each notices within CONFIG_RELOAD_INTERVAL_S",
                         exc)

    def _reload(self, in_thread=False):
        with self._lock:
            if self.snapshot is not None and not self.stale:
                return self.snapshot  # another thread reloaded while we waited
            # an edit of this process during the reload (the reload thread's lasts a while) may
            # have committed after the rows were read: it then still reloads here, after
            edits_seen = self._edits_here
            # "unknown" differs from any real version: reload once the store answers
            version = self._version_or("unknown")
            try:
                # the digest before the rows: a change landing between the two then makes the
                # next comparison reload once more, rather than hide behind a newer digest
                pause_s = RELOAD_PAUSE_S if in_thread else 0.0
                fingerprint = self._digest(pause_s) if self.reload_interval_s else None
                snapshot = self._load(version, pause_s)
            except Exception:  # a DB outage must not turn into 500s: keep the old rules
                logger.exception("ratelimit_app: could not load the quota configuration")
                if self.snapshot is None:
                    self.snapshot = Snapshot(version="unknown")
                # try again at the next version poll, not on every request
                self.stale = False
                self._edits_reloaded = self._edits_here
                self.checked_at = self._clock()
                self.retry_at = self.checked_at + self.check_interval_s
                return self.snapshot
            self.snapshot, self.fingerprint = snapshot, fingerprint
            self._edits_reloaded = edits_seen
            self.stale = self.reload_here
            self.checked_at = self._clock()
            self.compare_at = (self.checked_at + self.reload_interval_s
                               if self.reload_interval_s else math.inf)
            self._schedule(snapshot, self.checked_at)
            return snapshot

    def _schedule(self, snapshot, now):
        """Set the monotonic deadline of ``snapshot.next_change_at`` (a wall-clock time), at
        most SCHEDULE_RECHECK_S ahead of ``now``."""
        if snapshot.next_change_at == math.inf:
            self.switch_at = math.inf  # no dated row ahead: nothing to recheck
        else:
            remaining = snapshot.next_change_at - self._wall_clock()
            self.switch_at = now + min(max(remaining, 0.0), SCHEDULE_RECHECK_S)
        self.due_at = min(self.compare_at, self.switch_at)

    def _check_schedule(self, snapshot, now):
        """At ``switch_at``: mark the snapshot stale if a dated row started or ended, else set
        the deadline again from the wall clock (it was only a recheck)."""
        if self._wall_clock() >= snapshot.next_change_at:
            logger.info("ratelimit_app: a dated plan assignment or identity override starts or "
                        "ends now; reloading the rules")
            self.stale = True
        else:
            self._schedule(snapshot, now)
