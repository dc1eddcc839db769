"""Every rule that applies to a caller, in the rules list's words, with what is left now.

The levels come from ``inspector.bucket_rows``: one non-debiting script call for all of the
caller's buckets (nothing is charged, no key is created). The words are the rule row's own
(``Rule.describe``, as the rules list and the plan page say them); an identity override's
numbers are said beside them. Calendar quotas and prepaid balances get a run-out estimate at
the caller's pace over its last hours (pace.py).
"""

from ...config.models import Rule
from ...config.wording import count, per_period
from ..dashboard.inspector import bucket_rows
from .pace import pace_of, run_out

__all__ = ["limit_rows"]


def _state(row):
    if row["shadow"]:
        return "shadow: counted, never refused"
    if row["tokens"] < 1:
        return "empty: refusing now"
    if row["percent"] < 20:
        return "nearly empty"
    return "ok"


def _left_words(row):
    if row["credits"]:
        return f"{count(row['tokens'])} units left"
    if row["calendar"]:
        period = "today" if row["calendar"] == "day" else f"this {row['calendar']}"
        return f"{count(row['tokens'])} of {count(row['capacity'])} left {period}"
    return f"{count(row['tokens'])} of {count(row['capacity'])} left, full in " \
           f"{row['full_in_s']} s"


def _run_out(row, hours, now):
    """The run-out estimate of a calendar quota or a prepaid balance (None for others)."""
    if not (row["calendar"] or row["credits"]):
        return None
    pace = pace_of(hours, row["rule"], now)
    if row["credits"]:
        return run_out("the balance", row["tokens"], pace, now)
    what = f"{count(row['numbers'][0])} a {row['calendar']}"
    return run_out(what, row["tokens"], pace, now, resets_at=now + row["reset_s"])


def _override_words(row, rule):
    """The override's numbers when they are not the rule's ("" when they are)."""
    rate, period_s, burst = row["numbers"]
    if rule is None or (rate, period_s, burst) == (rule.rate, rule.period_s, rule.burst):
        return ""
    if row["calendar"] or row["credits"]:
        return f"this caller's override: {count(rate)}"
    return f"this caller's override: {count(rate)} {per_period(period_s)}, " \
           f"bursts up to {count(burst)}"


def limit_rows(caller, snapshot, hours, now):
    """Return ``(rows, exempt)`` for ``caller``: ``bucket_rows``' dicts, each with ``words``
    (the rule in the rules list's words), ``override`` (an override's numbers, or ""),
    ``left`` (what is left, in words), ``state`` ("empty: refusing now", …) and ``run_out``
    (a pace.RunOut, or None), the refusing ones first. ``hours`` is the caller's history
    (history.py). Raises StoreUnavailable."""
    rows, exempt = bucket_rows(caller.identity, snapshot)
    rules = Rule.objects.in_bulk([row["rule_id"] for row in rows])
    for row in rows:
        rule = rules.get(row["rule_id"])
        row["words"] = rule.describe() if rule else row["rate"]
        row["override"] = _override_words(row, rule)
        row["left"] = _left_words(row)
        row["state"] = _state(row)
        row["run_out"] = _run_out(row, hours, now)
    rows.sort(key=lambda row: (row["state"] != "empty: refusing now", row["percent"]))
    return rows, exempt
