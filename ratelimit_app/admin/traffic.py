"""The last hour's traffic beside the configuration: the requests and 429 rate of each rule or
plan in the admin's lists and the plan page, and what a rule's new numbers would have done to
the heaviest callers of the last hour.

Everything is read from the dashboard's metrics (``metrics/reads.py``), one read per page, and
stated as what it is: counts flushed by the workers (about a second behind) and, for new
numbers, an estimate. Redis being unreadable gives None ("—" on the page), never an error.
"""

from ..config.choices import CalendarPeriod, Counts, Kind
from ..config.wording import count
from ..decision.scopes import Scope
from ..runtime.limiter import default_limiter
from ..stores.base import READ_ERRORS
from .dashboard.data import outcome_rows

__all__ = ["last_hour_traffic", "impact_of_new_numbers", "hourly_allowance", "HEAVIEST_SHOWN"]

# How many of the last hour's heaviest callers a change of numbers is measured against.
HEAVIEST_SHOWN = 20


def last_hour_traffic(dimension):
    """Return ``{name: {"requests", "denied", "rate", …}}`` of the last hour for ``dimension``
    ("rule": by rule name, "plan": by plan slug), counted as the dashboard counts them, or None
    if Redis cannot be read."""
    try:
        breakdown = default_limiter().reader.breakdown("1h")
    except READ_ERRORS:
        return None
    return {row["name"]: row for row in outcome_rows(breakdown.get(dimension, {}), dimension)}


def hourly_allowance(rule):
    """Return the most units a caller can spend on ``rule`` in one hour starting with a full
    bucket (a token bucket: its burst and an hour's refill; a calendar quota: all of it), or
    None for the kinds that do not count units per caller this way."""
    if rule.counts != Counts.REQUESTS:
        return None
    if rule.kind == Kind.TOKEN_BUCKET and rule.rate and rule.period_s and rule.burst:
        return rule.burst + rule.rate * 3600 // rule.period_s
    if rule.kind == Kind.CALENDAR and rule.rate and rule.calendar_period in CalendarPeriod.values:
        return rule.rate
    return None


def impact_of_new_numbers(saved, new):
    """Return a sentence estimating what ``new`` (the numbers typed for the saved rule
    ``saved``) would have done to the last hour's heaviest callers, or "" when the numbers did
    not change or no estimate applies.

    The estimate counts the callers of the dashboard's hot keys (tokens spent in the last hour,
    on every rule) that spent more than the new numbers allow in an hour: each of them would
    have been refused at least once. It is a lower bound for a caller's own bucket (scope user
    or API key, no endpoint: the tokens the hot keys count are the ones it charges)."""
    allowance = hourly_allowance(new)
    if allowance is None or allowance == hourly_allowance(saved):
        return ""
    if new.scope != Scope.USER or new.endpoint:
        return ("No estimate for this rule: the last hour's figures are kept per caller and "
                "for every endpoint together.")
    try:
        heaviest = default_limiter().reader.hot_keys("1h", limit=HEAVIEST_SHOWN)["tokens"]
    except READ_ERRORS:
        return "No estimate: the dashboard's metrics cannot be read (Redis is unavailable)."
    plan_slug = saved.plan.slug if saved.plan_id else None
    callers = [row for row in heaviest if plan_slug is None or row["plan"] == plan_slug]
    if not callers:
        return "No estimate: no caller of this rule's plan was seen in the last hour."
    over = [row for row in callers if row["tokens"] > allowance]
    per_hour = f"{count(allowance)} tokens an hour the new numbers allow"
    if not over:
        return (f"Estimate: none of the {len(callers)} heaviest callers of the last hour would "
                f"have been refused; each used at most the {per_hour}.")
    return (f"Estimate: at least {len(over)} of the {len(callers)} heaviest callers of the last "
            f"hour would have been refused: each used more than the {per_hour}.")
