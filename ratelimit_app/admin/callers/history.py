"""A caller's last 24 hours, for its page: requests and refusals per hour, refusals by rule.

A key or a user has the hourly history the flush writes (metrics/caller_history.py). An
address has none (one client could otherwise grow Redis by rotating addresses): its page shows
what the hourly hot-key sets hold of it, which keep only the heaviest callers of each hour.
Reads go to the store directly, as the dashboard's do: a page's read never opens the breaker
that guards decisions.
"""

from collections import Counter

from ...conf import get_config
from ...metrics.caller_history import HISTORY_HOURS, read_history
from ...runtime.limiter import default_limiter
from ...stores.base import READ_ERRORS

__all__ = ["caller_history"]


def caller_history(caller, now):
    """Return ``{"kept", "hours", "refused_by", "allowed", "refused", "error"}``: ``hours``
    oldest first, each ``{"hour", "allowed", "refused", "units", "refused_by"}``; ``kept`` is
    False for an address (its hours are the hot-key sets' figures); ``refused_by`` is
    ``[(rule, refusals)]``, most first; ``error`` says why Redis could not be read."""
    limiter = default_limiter()
    history = {"kept": caller.has_history, "hours": [], "refused_by": [], "allowed": 0,
               "refused": 0, "error": ""}
    try:
        if caller.has_history:
            hours = read_history(limiter.store.metrics_client(), get_config()["KEY_PREFIX"],
                                 caller.ref, now)
        else:
            hours = [{"hour": row["hour"], "allowed": row["requests"] - row["denials"],
                      "refused": row["denials"], "units": {}, "refused_by": {}}
                     for row in limiter.reader.member_hours(caller.ref, HISTORY_HOURS, now)]
    except READ_ERRORS as exc:
        history["error"] = f"Redis is unavailable: {exc}"
        return history
    by_rule = Counter()
    for row in hours:
        by_rule.update(row["refused_by"])
    history.update(hours=hours, refused_by=by_rule.most_common(),
                   allowed=sum(row["allowed"] for row in hours),
                   refused=sum(row["refused"] for row in hours))
    return history
