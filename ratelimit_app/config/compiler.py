"""Rows → a Snapshot: which rows are read (the snapshot's parts, one per model), how they are
read (paced, off the request path), and what a compile after an edit reads again.

An edit's compile reads only what the versions since changed (``parts_to_read``): the rows they
named, patched into the parts of the snapshot held (``changes.py``), or a whole table when they
named it; the dated parts are read whole once one of their moments has passed.
"""
import bisect
import math
import operator
import time
import logging
from dataclasses import dataclass
from datetime import datetime, timezone

from .changes import by_table
from .row_queries import rows_by_id
from .snapshot import ApiKeyEntry, CompiledRule, OverrideEntry, Snapshot

__all__ = ["compile_snapshot", "config_models", "parts_to_read", "pause", "PARTS", "DATED_PARTS",
           "ROW_PARTS", "RowIndex", "FINGERPRINT_CHUNK_ROWS", "RELOAD_PAUSE_S"]

logger = logging.getLogger("ratelimit_app")


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


def _next_change(dates, now):
    """Return the earliest start or end after the datetime ``now`` among ``dates`` ((start,
    end) pairs, either None), as epoch s, or ``math.inf`` when none lies ahead."""
    moments = [moment for pair in dates for moment in pair if moment is not None and moment > now]
    return min(moments).timestamp() if moments else math.inf


def _dates(row):
    return row.starts_at, row.ends_at


@dataclass(frozen=True, slots=True)
class RowIndex:
    """What a compile of a few rows of a part needs to know of the part's other rows, which it
    does not read again: ``entries``, each row's entry in the part by row id (its key in the
    part's mapping, or the row itself where several rows make one entry), and ``dated``, the
    (start, end) of each row that has either. Immutable, like the snapshot that holds it."""

    entries: dict
    dated: dict

    @classmethod
    def of(cls, rows, entry, dated=lambda row: True):
        """Index ``rows``: ``entry(row)`` for each; the dates of those ``dated(row)`` keeps."""
        return cls({row.id: entry(row) for row in rows},
                   {row.id: _dates(row) for row in rows
                    if dated(row) and (row.starts_at is not None or row.ends_at is not None)})

    def patched(self, ids, fresh):
        """Return the index with the rows ``ids`` replaced by ``fresh`` (a RowIndex of those
        of them that still exist); a deleted row drops out."""
        entries, dated = dict(self.entries), dict(self.dated)
        for row_id in ids:
            entries.pop(row_id, None)
            dated.pop(row_id, None)
        entries.update(fresh.entries)
        dated.update(fresh.dated)
        return RowIndex(entries, dated)

    def next_change(self, moment):
        return _next_change(self.dated.values(), moment)


def compile_snapshot(version, now=None, pause_s=0.0, *, base=None, changed=None):
    """Read the configuration rows and return a Snapshot (the only DB access of the app).

    ``now`` (epoch s; default: the wall clock) picks the dated assignments and overrides
    that are active; the snapshot records when the next one starts or ends. With ``pause_s``
    (a thread's), it sleeps that long after every ``FINGERPRINT_CHUNK_ROWS`` rows it builds,
    for the reason ``config_fingerprint`` does (the GIL; see ``_paced``).

    With ``base`` (a snapshot compiled earlier) and ``changed`` (what changed since, as the
    versions record it: model names and rows, see ``changes.py``), only what changed is read:
    the rows named are read and patched into ``base``'s parts, the tables named are read whole,
    and the other parts are taken from ``base``. An edit of one rule reads that rule alone.

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
# them all; the dated parts are read again too once one of their moments has passed. The parts
# of ROW_PARTS can be patched with a few rows (the others are small tables, read whole: a row
# per plan, or per priced endpoint).
PARTS = {
    "plan": ("plans", "default_authenticated_plan", "default_anonymous_plan"),
    "rule": ("rules", "failed_auth_rules", "alerting_rules", "_rules_for"),
    "planassignment": ("assignments",),
    "apikey": ("api_keys",),
    "identityoverride": ("overrides",),
    "endpointcost": ("costs", "metering"),
    "banrule": ("ban_rules",),
    "accesslistentry": ("access_lists",),
}
DATED_PARTS = frozenset({"planassignment", "apikey", "identityoverride", "accesslistentry"})
ROW_PARTS = frozenset({"rule", "planassignment", "apikey", "identityoverride"})


def parts_to_read(base, changed, at):
    """Return what a compile at ``at`` (epoch s) must read: ``{part: None}`` to read a part
    (PARTS' names) whole, ``{part: frozenset of row ids}`` to read those rows and patch them
    into ``base``'s part. Every part whole without a ``base`` or a known ``changed`` (see
    compile_snapshot), or when a plan changed; the dated parts whole when one of ``base``'s
    moments passed before ``at``."""
    if base is None or changed is None:
        return dict.fromkeys(PARTS)
    tables = by_table(changed)
    if "plan" in tables:
        return dict.fromkeys(PARTS)
    parts = {part: rows if _patchable(base, part) else None
             for part, rows in tables.items() if part in PARTS}
    if base.next_change_at <= at:
        parts.update(dict.fromkeys(DATED_PARTS))
    return parts


def _patchable(base, part):
    """True when rows can be patched into ``base``'s ``part``: the rules, and the parts whose
    RowIndex ``base`` holds (a snapshot compile_snapshot made)."""
    return part == "rule" or (part in ROW_PARTS and part in base.part_rows)


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
            pause(pause_s)


def pause(pause_s):
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
    fields, part_moments, part_rows = {}, {}, {}
    for part, names in PARTS.items():
        if part not in parts:
            fields.update((name, getattr(base, name)) for name in names)
            if part in base.part_moments:
                part_moments[part] = base.part_moments[part]
            if part in base.part_rows:
                part_rows[part] = base.part_rows[part]
            continue
        ids = parts[part]
        if ids is None:
            read, index = _PART_READERS[part](moment, pause_s)
        else:
            read, index = _PART_PATCHERS[part](base, ids, moment)
        fields.update(read)
        if index is not None:
            part_rows[part] = index
            next_moment = index.next_change(moment)
            if next_moment != math.inf:
                part_moments[part] = next_moment
    return Snapshot(version=version, compiled_at=at, part_moments=part_moments,
                    part_rows=part_rows,
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
    }, None


_RULE_FIELDS = ("id", "name", "scope", "plan__slug", "endpoint", "rate", "period_s", "burst",
                "mode", "on_redis_failure", "counts", "lease", "calendar_period", "kind",
                "alert_thresholds", "debt", "counted_statuses", "counted_path_prefix")
_by_id = operator.attrgetter("id")


def _compiled_rules(rows):
    """Return the rule ``rows`` (named tuples of _RULE_FIELDS) as CompiledRules."""
    from .models import Counts, FailureMode, Kind, Mode, parse_alert_thresholds, parse_statuses

    fail_open = {FailureMode.OPEN: True, FailureMode.CLOSED: False}
    return [
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
            debt=r.debt,
            credits=r.kind == Kind.CREDITS,
            refill=r.calendar_period if r.kind == Kind.CREDITS else "",
            response_statuses=parse_statuses(r.counted_statuses) if r.counted_statuses else (),
            response_prefix=r.counted_path_prefix,
        )
        for r in rows
    ]


def _counts_failed_auth(rule):
    return rule.failed_auth


def _alerts_on_requests(rule):
    # (a credits rule's thresholds are of its accounts' top-ups: the checkpoint's, not the
    # request path's, see business/credits/alerts.py)
    return bool(rule.alerts) and not rule.credits


def _rule_fields(rules, failed_auth_rules, alerting_rules):
    """The Snapshot fields of ``rules`` (a tuple ordered by id), with those of them that count
    failed authentications and those with alert thresholds the request path checks."""
    return {
        "rules": rules,
        "failed_auth_rules": failed_auth_rules,
        "alerting_rules": alerting_rules,
        "_rules_for": {},  # the memo of rules_for starts afresh with new rules
    }


# (the rules need no RowIndex: a rule is its own entry, found in ``base.rules`` by its id)
def _read_rules(moment, pause_s):
    from .models import Rule

    rules = tuple(_compiled_rules(_rows(Rule.objects.filter(enabled=True).order_by("id"),
                                        *_RULE_FIELDS, pause_s=pause_s)))
    return _rule_fields(rules, tuple(filter(_counts_failed_auth, rules)),
                        tuple(filter(_alerts_on_requests, rules))), None


def _patch_rules(base, ids, moment):
    """The rule fields of ``base`` with the rules ``ids`` read again: each found by bisection
    in the tuples ordered by id, so an edit of one rule among a thousand costs each worker
    about what one rule does."""
    from .models import Rule

    fresh = _compiled_rules(rows_by_id(Rule, _RULE_FIELDS, ids, enabled=True))
    return _rule_fields(
        _patched_by_id(base.rules, ids, fresh),
        _patched_by_id(base.failed_auth_rules, ids, filter(_counts_failed_auth, fresh)),
        _patched_by_id(base.alerting_rules, ids, filter(_alerts_on_requests, fresh))), None


def _patched_by_id(rules, ids, fresh):
    """Return ``rules`` (a tuple ordered by id) without the rules ``ids``, with ``fresh``
    (rules read again, some of ``ids``) in their places."""
    patched = list(rules)
    for rule_id in ids:
        at = bisect.bisect_left(patched, rule_id, key=_by_id)
        if at < len(patched) and patched[at].id == rule_id:
            del patched[at]
    for rule in fresh:
        bisect.insort(patched, rule, key=_by_id)
    return tuple(patched)


_ASSIGNMENT_FIELDS = ("id", "user_id", "plan__slug", "tenant", "starts_at", "ends_at")


def _assignment_user(row):
    return str(row.user_id)


def _active_assignments(rows, moment):
    from .models import active_at

    return {_assignment_user(a): (a.plan__slug, a.tenant)
            for a in rows if active_at(a.starts_at, a.ends_at, moment)}


def _read_assignments(moment, pause_s):
    from .models import PlanAssignment

    rows = _rows(PlanAssignment.objects.all(), *_ASSIGNMENT_FIELDS, pause_s=pause_s)
    return ({"assignments": _active_assignments(rows, moment)},
            RowIndex.of(rows, _assignment_user))


def _patch_assignments(base, ids, moment):
    from .models import PlanAssignment

    rows = rows_by_id(PlanAssignment, _ASSIGNMENT_FIELDS, ids)
    index = base.part_rows["planassignment"]
    assignments = _without(base.assignments, index, ids)
    assignments.update(_active_assignments(rows, moment))
    return {"assignments": assignments}, index.patched(ids, RowIndex.of(rows, _assignment_user))


def _without(mapping, index, ids):
    """Return a copy of a part's ``mapping`` without the entries the rows ``ids`` made."""
    mapping = dict(mapping)
    for row_id in ids:
        mapping.pop(index.entries.get(row_id), None)
    return mapping


_API_KEY_FIELDS = ("id", "digest", "prefix", "user_id", "plan_id", "plan__slug", "tenant",
                   "starts_at", "ends_at")
_digest_of = operator.attrgetter("digest")


def _api_key_entries(rows, moment):
    from .models import active_at

    # a key's plan outside its dates is None: the key is on its user's plan meanwhile
    return {
        k.digest: ApiKeyEntry(k.id, k.prefix, str(k.user_id),
                              k.plan__slug if k.plan_id and active_at(k.starts_at, k.ends_at,
                                                                      moment) else None,
                              k.tenant)
        for k in rows
    }


def _api_key_index(rows):
    # only a key's plan has dates: a key without a plan changes nothing at them
    return RowIndex.of(rows, _digest_of, dated=operator.attrgetter("plan_id"))


def _read_api_keys(moment, pause_s):
    from .models import ApiKey

    rows = _rows(ApiKey.objects.filter(active=True), *_API_KEY_FIELDS, pause_s=pause_s)
    return {"api_keys": _api_key_entries(rows, moment)}, _api_key_index(rows)


def _patch_api_keys(base, ids, moment):
    from .models import ApiKey

    rows = rows_by_id(ApiKey, _API_KEY_FIELDS, ids, active=True)
    index = base.part_rows["apikey"]
    api_keys = _without(base.api_keys, index, ids)
    api_keys.update(_api_key_entries(rows, moment))
    return {"api_keys": api_keys}, index.patched(ids, _api_key_index(rows))


_OVERRIDE_FIELDS = ("id", "user_id", "api_key_id", "ip", "exempt", "rule_id", "rate",
                    "period_s", "burst", "factor", "starts_at", "ends_at")


def _active_overrides(rows, moment):
    """Return the overrides of ``rows`` (ordered by id) active at ``moment``, by identity."""
    from ..decision.identity import limited_ip
    from .models import active_at

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
            OverrideEntry(o.exempt, o.rule_id, o.rate, o.period_s, o.burst, o.factor))
    return {k: tuple(v) for k, v in overrides.items()}


# (several overrides may make one identity's entry, in an order: the index keeps the rows
# themselves, few beside the other tables, and a patch builds the overrides from them again)
def _read_overrides(moment, pause_s):
    from .models import IdentityOverride

    rows = _rows(IdentityOverride.objects.order_by("id"), *_OVERRIDE_FIELDS, pause_s=pause_s)
    return {"overrides": _active_overrides(rows, moment)}, RowIndex.of(rows, lambda row: row)


def _patch_overrides(base, ids, moment):
    from .models import IdentityOverride

    fresh = rows_by_id(IdentityOverride, _OVERRIDE_FIELDS, ids)
    index = base.part_rows["identityoverride"].patched(ids, RowIndex.of(fresh, lambda row: row))
    rows = sorted(index.entries.values(), key=_by_id)
    return {"overrides": _active_overrides(rows, moment)}, index


def _read_costs(moment, pause_s):
    from .models import EndpointCost

    rows = _rows(EndpointCost.objects.all(), "endpoint", "method", "plan__slug", "cost",
                 "metered", "minimum", pause_s=pause_s)
    costs = {(c.endpoint, c.method, c.plan__slug): c.cost for c in rows}
    # a metered row's minimum charge; the rows that are not metered are there too (as None),
    # so a plan's own unmetered row hides a metered row for every plan, as it does its cost
    metering = {(c.endpoint, c.method, c.plan__slug): c.minimum if c.metered else None
                for c in rows} if any(c.metered for c in rows) else {}
    return {"costs": costs, "metering": metering}, None


def _read_ban_rules(moment, pause_s):
    from ..protection.bans import compile_ban_rule
    from .models import BanRule, parse_statuses

    rows = _rows(BanRule.objects.filter(enabled=True).order_by("id"), "id", "name", "scope",
                 "events", "statuses", "path_prefix", "threshold", "window_s", "ban_s",
                 "factor", "max_ban_s", "memory_s", "extend_on_retry", "mode",
                 pause_s=pause_s)
    return {"ban_rules": tuple(
        compile_ban_rule(row, parse_statuses(row.statuses) if row.statuses else ())
        for row in rows)}, None


_ACCESS_LIST_FIELDS = ("id", "kind", "target", "value", "user_id", "api_key_id", "exempt",
                       "reason", "starts_at", "ends_at")


# (read whole at every change: the index by network and prefix length is rebuilt anyway; the
# RowIndex holds only the entries' dates, for the moments they start and stop)
def _read_access_lists(moment, pause_s):
    from ..conf import get_config
    from ..protection.lists import AccessLists
    from .models import AccessListEntry, active_at

    rows = _rows(AccessListEntry.objects.order_by("id"), *_ACCESS_LIST_FIELDS, pause_s=pause_s)
    lists = AccessLists.from_rows([row for row in rows
                                   if active_at(row.starts_at, row.ends_at, moment)],
                                  get_config()["IPV6_PREFIX_LENGTH"])
    return {"access_lists": lists}, RowIndex({}, {row.id: _dates(row) for row in rows
                                                  if row.starts_at or row.ends_at})


# part -> reader(moment, pause_s): (Snapshot fields, RowIndex or None) of the whole table
_PART_READERS = {
    "plan": _read_plans,
    "rule": _read_rules,
    "planassignment": _read_assignments,
    "apikey": _read_api_keys,
    "identityoverride": _read_overrides,
    "endpointcost": _read_costs,
    "banrule": _read_ban_rules,
    "accesslistentry": _read_access_lists,
}
# part -> patcher(base, ids, moment): the same, from ``base``'s part and the rows ``ids``
_PART_PATCHERS = {
    "rule": _patch_rules,
    "planassignment": _patch_assignments,
    "apikey": _patch_api_keys,
    "identityoverride": _patch_overrides,
}


# A paced compile_snapshot builds this many rows between pauses, and config_fingerprint reads
# and hashes this many at a time: a few tenths of a millisecond of CPU (see fingerprint.py).
FINGERPRINT_CHUNK_ROWS = 50
# The pause of the watcher's compile of a dated row's snapshot ahead of its moment: nobody
# waits for it, so it keeps its share of its worker's GIL to about 10 %. (The compiles of the
# rules in force are not paced: requests are fenced until they are done.)
RELOAD_PAUSE_S = 0.003


def config_models():
    """Return the models whose rows ``compile_snapshot`` reads (the tables a fingerprint covers
    and whose saves and deletes announce a new config version)."""
    from .models import (
        AccessListEntry,
        ApiKey,
        BanRule,
        EndpointCost,
        IdentityOverride,
        Plan,
        PlanAssignment,
        Rule,
    )

    return (Plan, PlanAssignment, ApiKey, Rule, EndpointCost, IdentityOverride, BanRule,
            AccessListEntry)
