"""Rows → a Snapshot: which rows are read (the snapshot's parts, one per model), how they are
read (paced, off the request path), and what a compile after an edit reads again.

An edit's compile reads only the parts the versions since changed (``parts_to_read``); the
dated parts are read again too once one of their moments has passed.
"""
import math
import time
import logging
from datetime import datetime, timezone

from .snapshot import ApiKeyEntry, CompiledRule, OverrideEntry, Snapshot

__all__ = ["compile_snapshot", "config_models", "parts_to_read", "pause", "PARTS", "DATED_PARTS",
           "FINGERPRINT_CHUNK_ROWS", "RELOAD_PAUSE_S"]

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
    "endpointcost": ("costs", "metering"),
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
            debt=r.debt,
            credits=r.kind == Kind.CREDITS,
            refill=r.calendar_period if r.kind == Kind.CREDITS else "",
        )
        for r in _rows(Rule.objects.filter(enabled=True).order_by("id"),
                       "id", "name", "scope", "plan__slug", "endpoint", "rate", "period_s",
                       "burst", "mode", "on_redis_failure", "counts", "lease", "calendar_period",
                       "kind", "alert_thresholds", "debt", pause_s=pause_s)
    )
    return {
        "rules": rules,
        "failed_auth_rules": tuple(r for r in rules if r.failed_auth),
        # (a credits rule's thresholds are of its accounts' top-ups: the checkpoint's, not the
        # request path's, see business/credits/alerts.py)
        "has_alerts": any(r.alerts and not r.credits for r in rules),
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

    rows = _rows(EndpointCost.objects.all(), "endpoint", "method", "plan__slug", "cost",
                 "metered", "minimum", pause_s=pause_s)
    costs = {(c.endpoint, c.method, c.plan__slug): c.cost for c in rows}
    # a metered row's minimum charge; the rows that are not metered are there too (as None),
    # so a plan's own unmetered row hides a metered row for every plan, as it does its cost
    metering = {(c.endpoint, c.method, c.plan__slug): c.minimum if c.metered else None
                for c in rows} if any(c.metered for c in rows) else {}
    return {"costs": costs, "metering": metering}, math.inf


_PART_READERS = {
    "plan": _read_plans,
    "rule": _read_rules,
    "planassignment": _read_assignments,
    "apikey": _read_api_keys,
    "identityoverride": _read_overrides,
    "endpointcost": _read_costs,
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
    from .models import ApiKey, EndpointCost, IdentityOverride, Plan, PlanAssignment, Rule

    return (Plan, PlanAssignment, ApiKey, Rule, EndpointCost, IdentityOverride)


