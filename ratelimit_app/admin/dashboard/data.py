"""What the dashboard shows, assembled from the metrics in Redis and this process's health.

``dashboard_data`` returns plain data (the JSON endpoint's body); the page renders the same data
with the fragment templates, and the JSON carries those fragments too so the live refresh
replaces them without reloading the page. The page leads with what an operator looks at first
(``LEAD_FRAGMENTS``: health in one line, the 429 rate over time, the hottest callers, the bans),
the rest below.
"""

import datetime
import re
import time
from urllib.parse import urlencode

from django.db.models import F, Q
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from ... import metrics
from ...business.credits.figures import CreditFigures
from ...business.credits.ledger import last_top_up, state_of, stored_states
from ...business.credits.models import CreditAccount
from ...business.credits.rules import AccountRules
from ...conf import get_config
from ...config.ban_records import ban_log, current_bans, unlisted_bans
from ...config.models import ApiKey, Ban, IdentityOverride, PlanAssignment, Scheduled
from ...config.override_words import treatment_words
from ...metrics.models import Dashboard
from ...runtime.limiter import default_limiter
from ...stores.base import READ_ERRORS
from ..list_cells import moment
from ..placement import admin_url_name
from .charts import rate_chart, requests_chart
from .rates import LINES_SHOWN, RANGES, range_summary, rate_rows, rates_over_time

__all__ = ["dashboard_data", "FRAGMENTS", "LEAD_FRAGMENTS", "inspect_url", "rate", "parse_id",
           "outcome_rows", "hottest_callers"]

# Fragment name -> template; each is a <section data-fragment="name"> on the page. The lead
# ones fill the first screen (dashboard.html lays them out); the others follow in this order.
LEAD_FRAGMENTS = {
    "health_line": "ratelimit_app/dashboard_health_line.html",
    "rate_chart": "ratelimit_app/dashboard_rate_chart.html",
    "callers": "ratelimit_app/dashboard_callers.html",
    "bans": "ratelimit_app/dashboard_bans.html",
}
FRAGMENTS = {
    **LEAD_FRAGMENTS,
    "summary": "ratelimit_app/dashboard_summary.html",
    "chart": "ratelimit_app/dashboard_chart.html",
    "rates": "ratelimit_app/dashboard_rates.html",
    "near_limit": "ratelimit_app/dashboard_near_limit.html",
    "temporary": "ratelimit_app/dashboard_temporary.html",
    "credits": "ratelimit_app/dashboard_credits.html",
    "ban_log": "ratelimit_app/dashboard_ban_log.html",
    "health": "ratelimit_app/dashboard_health.html",
}
HOT_KEYS_SHOWN = 10
# Bans listed on the first screen; the rest are on the bans' own list.
BANS_SHOWN_FIRST = 5
CREDIT_ACCOUNTS_SHOWN = 10
BUFFERED_PERIODS_SHOWN = 5
# A database id in a ref: ASCII digits only (str.isdigit() also accepts "²"), and short enough
# for any database's integer column.
_ID = re.compile(r"[0-9]{1,18}")


def parse_id(text):
    """Return ``text`` as a database id, or None if it is not one."""
    return int(text) if _ID.fullmatch(text) else None


def rate(denied, total):
    """Return ``denied / total`` as a percentage rounded to 0.1 (0 when there is no traffic)."""
    return round(100 * denied / total, 1) if total else 0.0


def live_credit_states(accounts):
    """Return the live balances in Redis of the credit ``accounts``, by ref; {} while Redis
    cannot be read (the pages then show each account's last checkpoint)."""
    try:
        return stored_states(default_limiter().store.metrics_client(),
                             get_config()["KEY_PREFIX"], [a.ref for a in accounts])
    except READ_ERRORS:
        return {}


def inspect_url(ref):
    """Return the page of the caller ``ref`` (``key:<id>``, ``user:<id>``, ``ip:<address>``;
    any text the caller search takes): every page links to a caller through here."""
    return reverse(admin_url_name(Dashboard, "caller")) + "?" + urlencode({"q": ref})


def outcome_rows(items, dimension):
    """Return the rows of a breakdown's ``items`` of ``dimension`` ("rule": the requests it was
    checked on; others: what they allowed and refused), most refused first: ``{"name",
    "requests", "denied", "shadow", "rate"}``."""
    rows = []
    for name, counts in items.items():
        if dimension == "rule":
            total, denied = counts.get("checked", 0), counts.get("denied", 0)
        else:
            denied = counts.get("denied", 0)
            total = counts.get("allowed", 0) + denied
        rows.append({"name": name, "requests": total, "denied": denied,
                     "shadow": counts.get("shadow", 0), "rate": rate(denied, total)})
    return sorted(rows, key=lambda row: (-row["rate"], -row["requests"], row["name"]))


def _labels(refs):
    """Return ``{ref: label}`` for API key refs (their display alone is just a shared prefix)."""
    ids = [parse_id(ref[4:]) for ref in refs if ref.startswith("key:")]
    ids = [key_id for key_id in ids if key_id is not None]
    found = ApiKey.objects.filter(pk__in=ids).select_related("user")
    return {f"key:{k.id}": f"{k.user.get_username()} · key {k.prefix}…" for k in found}


def hottest_callers(hot, limit=HOT_KEYS_SHOWN):
    """Return the two hot-key tables of ``hot`` (by denials, by tokens: the same callers, mostly)
    as one: each caller once, the most refused first, then the heaviest, at most ``limit``."""
    merged = {}
    for row in (*hot.get("denials", ()), *hot.get("tokens", ())):
        merged.setdefault(row["member"], row)
    return sorted(merged.values(), key=lambda row: (
        -row["denials"], -row["tokens"], -row["requests"], row.get("label", row["display"])))[
        :limit]


def _decorate(rows, labels):
    for row in rows:
        row["label"] = labels.get(row["ref"], row["display"])
        row["inspect_url"] = inspect_url(row["ref"])
        if "requests" in row:
            row["rate"] = rate(row["denials"], row["requests"])
    return rows


def _clock_text(unix_s):
    moment = datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc)
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")


def _flush_state(now, last_flush_age_s, buffered, oldest_pending_at):
    """Return how this process's metrics flush is doing: "failing" (flushes fail, decisions
    are buffered), "late" (decisions wait longer than a few flush intervals: the flush thread
    is not running), "idle" (no flush for a while because there was nothing to flush: no
    traffic is healthy) or "ok"."""
    late_s = 3 * float(get_config()["METRICS_FLUSH_INTERVAL_S"]) + 2
    if default_limiter().flusher.failing_since is not None:
        return "failing"
    if buffered and oldest_pending_at is not None and now - oldest_pending_at > late_s:
        return "late"
    if last_flush_age_s is None or last_flush_age_s > late_s:
        return "idle"
    return "ok"


def _read_failed(health, exc):
    """Note in ``health`` that reading Redis raised ``exc``."""
    health["redis_ok"], health["redis_error"] = False, f"{type(exc).__name__}: {exc}"
    health["redis_error_unexpected"] = not isinstance(exc, READ_ERRORS)


def _unexpected_errors(stats):
    """Return what the health panel shows of this process's unexpected errors on the decision
    path (a bug or a library incompatibility; see process/unexpected.py): how many, and the
    last."""
    at = stats.last_unexpected_at
    return {"count": stats.unexpected_errors, "by_type": dict(stats.unexpected_by_type),
            "last_type": stats.last_unexpected_type,
            "last_message": stats.last_unexpected_message,
            "last_at": at, "last_at_text": _clock_text(at) if at else ""}


def _health(now):
    limiter = default_limiter()
    buffered, oldest_pending_at = default_limiter().recorder.pending_decisions()
    failing_since = default_limiter().flusher.failing_since
    in_use = limiter.policies.snapshot  # (before anything here loads newer rules)
    health = {"redis_ok": True, "redis_latency_ms": None, "redis_error": "",
              "redis_error_unexpected": False,
              "breaker": limiter.breaker.state, "redis_errors": limiter.stats.redis_errors,
              "unexpected": _unexpected_errors(limiter.stats),
              "store": limiter.store.kind,
              "config_version": None, "last_flush_age_s": None,
              "config_in_use": in_use.version if in_use is not None else None,
              "flush_error": default_limiter().flusher.last_error, "dropped": default_limiter().recorder.dropped,
              "buffered_decisions": buffered, "failing_since": failing_since,
              "failing_since_text": _clock_text(failing_since) if failing_since else "",
              "pending_age_s": round(now - oldest_pending_at, 1) if buffered else None,
              "buffered_periods": []}
    # straight to the store, not through the breaker: the dashboard's reads must never open
    # the breaker that guards decisions
    try:
        started = time.perf_counter()
        limiter.store.ping()
        health["redis_latency_ms"] = round((time.perf_counter() - started) * 1000, 2)
        flushed_at = default_limiter().reader.last_flush_at()
        if flushed_at is not None:
            health["last_flush_age_s"] = round(max(0.0, now - flushed_at), 1)
        health["config_version"] = limiter.store.read_version(limiter.version_key)
        health["buffered_periods"] = [
            {**period, "from_text": _clock_text(period["from"]),
             "to_text": _clock_text(period["to"])}
            for period in default_limiter().reader.buffered_periods()[:BUFFERED_PERIODS_SHOWN]]
    except Exception as exc:  # Redis down (READ_ERRORS), or a client that fails in another way
        # (a library incompatibility): the page must still say what it knows
        _read_failed(health, exc)
    health["flush_state"] = _flush_state(now, health["last_flush_age_s"], buffered,
                                         oldest_pending_at)
    health["config_fresh"] = _config_fresh(health["config_in_use"], health["config_version"])
    return health


def _config_fresh(in_use, published):
    """Whether this process decides on the latest published config version: True, False (it
    has not loaded it yet: it does within about a second), or None when either is unknown (no
    rules loaded yet, Redis unreadable)."""
    if in_use is None or published is None:
        return None
    return str(in_use) == str(published)


def ban_rows(now, limit=50):
    """Return the bans in force at ``now`` (who, by which rule, since, until, the how-many-th
    within the rule's memory), latest first, at most ``limit``."""
    return [{"id": ban.pk, "who": ban.who, "rule": ban.rule_name, "since": moment(ban.since),
             "until": moment(ban.until), "times": ban.times}
            for ban in current_bans(now)[:limit]]


def unlisted_ban_rows(now):
    """Return, per ban-log entry of the last hour with more bans than rows, how many of its
    bans are not listed in "Banned now" (Redis refuses them all the same)."""
    since = now - datetime.timedelta(hours=1)
    return [{"rule": entry.rule_name, "from": moment(entry.interval_start), "bans": entry.bans,
             "unlisted": unlisted}
            for entry, unlisted in unlisted_bans(since)]


def ban_log_rows(limit=20):
    """Return the latest ``limit`` entries of the ban log (bans per rule and interval, and
    lifts by staff), latest first: when, and what in words."""
    rows = []
    for entry in ban_log(limit):
        if entry.kind == "lifted":
            what = f"{entry.actor} lifted the ban of {entry.who} by {entry.rule_name}"
        else:
            verb = "would have banned" if entry.shadow else "banned"
            shown = ", ".join(caller["who"] for caller in entry.callers[:3])
            more = entry.bans - min(3, len(entry.callers))
            what = (f"{entry.rule_name} {verb} {entry.bans} "
                    f"caller{'' if entry.bans == 1 else 's'}: {shown}"
                    + (f" and {more} more" if more > 0 else ""))
        rows.append({"at": moment(entry.at), "kind": entry.kind, "what": what})
    return rows


def temporary_rows(now):
    """Return who is on a temporary override or plan assignment (of a user, or an API key's
    own plan) at the datetime ``now``: one dict per row (identity, what it changes, until when,
    reason), the soonest to end first."""
    rows = []
    dated = ~(Q(starts_at__isnull=True) & Q(ends_at__isnull=True))
    overrides = IdentityOverride.objects.filter(dated, Scheduled.active_q(now)).select_related(
        "user", "api_key", "rule")
    for o in overrides:
        rows.append({"kind": "override", "identity": str(o.user or o.api_key or o.ip),
                     "what": f"{o.rule or 'every user/IP rule'}: {treatment_words(o)}",
                     "ends_at": o.ends_at, "reason": o.reason})
    assignments = PlanAssignment.objects.filter(dated, Scheduled.active_q(now)).select_related(
        "user", "plan")
    for a in assignments:
        rows.append({"kind": "plan", "identity": str(a.user), "what": f"plan {a.plan}",
                     "ends_at": a.ends_at, "reason": a.reason})
    keys = ApiKey.objects.filter(dated, Scheduled.active_q(now), active=True,
                                 plan__isnull=False).select_related("user", "plan")
    for k in keys:
        rows.append({"kind": "key-plan", "identity": f"key {k} of {k.user}",
                     "what": f"plan {k.plan}", "ends_at": k.ends_at, "reason": k.reason})
    far = datetime.datetime.max.replace(tzinfo=datetime.timezone.utc)
    rows.sort(key=lambda row: (row["ends_at"] or far, row["identity"]))
    for row in rows:
        row["until_text"] = (timezone.localtime(row["ends_at"]).strftime("%Y-%m-%d %H:%M")
                             if row["ends_at"] else "no end")
        row["ends_at"] = row["ends_at"].timestamp() if row["ends_at"] else None  # JSON-ready
    return rows


def credit_rows():
    """Return the prepaid credit accounts with the fewest prepaid units left (those the last
    checkpoint found lowest, CREDIT_ACCOUNTS_SHOWN of them), each with its figures (see
    business/credits/figures.py) from its live balance where Redis can be read, its last
    top-up and its admin page; [] where credits are not used."""
    accounts = list(CreditAccount.objects.annotate(left=F("granted") - F("spent"))
                    .order_by("left", "ref")[:CREDIT_ACCOUNTS_SHOWN])
    if not accounts:
        return []
    live = live_credit_states(accounts)
    rules = _account_rules()
    rows = []
    for account in accounts:
        state, last = live.get(account.ref), last_top_up(account)
        figures = CreditFigures.of_account(rules, account.ref, state or state_of(account))
        rows.append({
            "account": str(account),
            "units_left": figures.units_left,
            "prepaid_left": figures.prepaid_left,
            "allowance": figures.allowance.units,
            "allowance_period": figures.allowance.period,
            "allowance_used": figures.allowance_used,
            "allowance_used_text": figures.allowance_used_in_words(),
            "used_in_period": figures.used_in_period,
            "live": state is not None,
            "last_top_up": last.units if last else None,
            "last_top_up_at": timezone.localtime(last.created).strftime("%Y-%m-%d %H:%M")
            if last else "",
            "url": reverse(admin_url_name(CreditAccount, "change"), args=[account.pk]),
        })
    rows.sort(key=lambda row: (row["prepaid_left"], row["account"]))
    return rows


def _account_rules():
    """The credits rules in force (which name each account's allowance); none when the policy
    cannot be had now (the health panel says why): every allowance then reads unknown."""
    try:
        return AccountRules(default_limiter().snapshot())
    except Exception:  # as in _shadow_rules: a store client that fails unexpectedly
        return AccountRules(None)


def _shadow_rules(rule_rows):
    try:
        rules = default_limiter().snapshot().rules
    except Exception:  # a store client that fails unexpectedly (the health panel says so)
        rules = ()
    names = {rule.name for rule in rules if rule.shadow}
    names |= {row["name"] for row in rule_rows if row["shadow"]}
    by_name = {row["name"]: row for row in rule_rows}
    rows = []
    for name in sorted(names):
        row = by_name.get(name, {"requests": 0, "shadow": 0})
        rows.append({"name": name, "requests": row["requests"], "would_deny": row["shadow"],
                     "rate": rate(row["shadow"], row["requests"])})
    return rows


def dashboard_data(window="1h", now=None, with_html=True):
    """Return everything the dashboard shows for ``window`` ("5m", "1h" or "24h") as plain data
    (plus ``html`` fragments when ``with_html``). Redis being down gives empty tables and a
    health section that says so, never an exception."""
    window = window if window in metrics.WINDOWS else "1h"
    now = time.time() if now is None else now
    health = _health(now)
    series, breakdown, hot, near = [], {}, {"tokens": [], "denials": []}, []
    over_time = None
    if health["redis_ok"]:
        try:
            over_time = rates_over_time(default_limiter().reader, now)
            series = default_limiter().reader.series(60, now=now)
            breakdown = default_limiter().reader.breakdown(window, now=now)
            hot = default_limiter().reader.hot_keys(window, limit=HOT_KEYS_SHOWN, now=now)
            near = default_limiter().reader.near_limit(now=now)
        except Exception as exc:  # as in _health: READ_ERRORS, or a broken client
            _read_failed(health, exc)
    overall = breakdown.get("all", {}).get("", {})
    allowed, denied = overall.get("allowed", 0), overall.get("denied", 0)
    rules = outcome_rows(breakdown.get("rule", {}), "rule")
    labels = _labels({row["ref"] for rows in (*hot.values(), near) for row in rows})
    data = {
        "window": window,
        "windows": list(metrics.WINDOWS),
        "generated_at": now,
        "summary": {"requests": allowed + denied, "allowed": allowed, "denied": denied,
                    "shadow": overall.get("shadow", 0), "rate_429": rate(denied, allowed + denied),
                    "degraded": sum(c.get("count", 0)
                                    for c in breakdown.get("degraded", {}).values())},
        "series": series,
        "rates": {"plan": outcome_rows(breakdown.get("plan", {}), "plan"),
                  "rule": [row for row in rules if row["requests"] or row["denied"]],
                  "endpoint": outcome_rows(breakdown.get("endpoint", {}), "endpoint")},
        "shadow_rules": _shadow_rules(rules),
        "hot_keys": {metric: _decorate(rows, labels) for metric, rows in hot.items()},
        "callers": hottest_callers(hot),
        "rates_over_time": over_time,
        "rate_table": {dimension: rate_rows(over_time, dimension) if over_time else []
                       for dimension in ("plan", "rule")},
        "near_limit": _decorate(near, labels),
        "health": health,
        "temporary": temporary_rows(datetime.datetime.fromtimestamp(now,
                                                                   tz=datetime.timezone.utc)),
        "credits": credit_rows(),
        "bans": ban_rows(datetime.datetime.fromtimestamp(now, tz=datetime.timezone.utc)),
        "bans_url": reverse(admin_url_name(Ban, "changelist")),
        "unlisted_bans": unlisted_ban_rows(datetime.datetime.fromtimestamp(
            now, tz=datetime.timezone.utc)),
        "ban_log": ban_log_rows(),
    }
    if with_html:
        context = {**data, "chart_svg": requests_chart(series) if series else "",
                   "rate_panels": _rate_panels(data), "bans_shown_first": BANS_SHOWN_FIRST,
                   "rate_summaries": [range_summary(over_range) for over_range
                                      in (data["rates_over_time"] or {}).values()]}
        data["html"] = {name: render_to_string(template, context)
                        for name, template in FRAGMENTS.items()}
    return data


def _rate_panels(data):
    """Return the lead chart's panels, one per dimension (plan, rule): ``{"dimension",
    "charts": [(range name, svg)], "rows": the table's first rows, "more": rows not shown}``,
    each line drawn in the colour of its row; [] while Redis cannot be read."""
    over_time = data["rates_over_time"]
    if not over_time:
        return []
    panels = []
    for dimension, rows in data["rate_table"].items():
        drawn = {row["name"]: row["drawn"] for row in rows if row["drawn"] is not None}
        panels.append({
            "dimension": dimension,
            "charts": [(name, rate_chart(name, over_time[name], dimension, drawn))
                       for name in RANGES],
            "rows": rows[:LINES_SHOWN], "more": max(0, len(rows) - LINES_SHOWN)})
    return panels
