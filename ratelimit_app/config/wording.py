"""The words a rule is spelled out in: numbers, periods, durations and scopes as an operator
reads them ("10,000", "per minute", "per user or API key").

The sentences themselves belong to each kind of limit (``rule_kinds.py``) and to a ban rule
(``BanRule.describe``); they are built only from these pieces, so the lists, the plan page and
the forms' live previews all say the same.
"""

from ..decision.scopes import Scope

__all__ = ["count", "per_period", "duration", "a_duration", "either", "SCOPE_PHRASES",
           "SCOPE_SHORT", "status_words"]

# Each scope as the end of a sentence ("100 requests per minute per tenant").
SCOPE_PHRASES = {
    Scope.GLOBAL: "for all callers together",
    Scope.PLAN: "for all callers of the plan together",
    Scope.TENANT: "per tenant",
    Scope.USER: "per user or API key",
    Scope.IP: "per client IP",
}

# Each scope in a list cell.
SCOPE_SHORT = {
    Scope.GLOBAL: "global", Scope.PLAN: "plan", Scope.TENANT: "tenant",
    Scope.USER: "user or key", Scope.IP: "client IP",
}

# Seconds -> the unit's name, largest first ("per 2 hours", "after 30 seconds").
_UNITS = (("week", 7 * 86400), ("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def count(number):
    """Return ``number`` with thousands separators: 10000 -> '10,000'."""
    return f"{number:,}"


def _in_units(seconds):
    """Return ``(n, unit)`` of the largest unit that divides ``seconds`` exactly."""
    for unit, length in _UNITS:
        if seconds % length == 0:
            return seconds // length, unit
    return seconds, "second"  # not reached: every whole number of seconds divides by 1


def per_period(seconds):
    """Return 'per minute' for 60, 'per 10 minutes' for 600, 'per 90 seconds' for 90."""
    n, unit = _in_units(seconds)
    return f"per {unit}" if n == 1 else f"per {count(n)} {unit}s"


def duration(seconds):
    """Return '1 minute' for 60, '90 seconds' for 90, '2 hours' for 7200."""
    n, unit = _in_units(seconds)
    return f"{count(n)} {unit}" + ("" if n == 1 else "s")


def a_duration(seconds):
    """Return 'a minute' for 60, 'an hour' for 3600, '10 minutes' for 600: a duration read
    after "within" or "up to"."""
    n, unit = _in_units(seconds)
    if n == 1:
        return ("an " if unit == "hour" else "a ") + unit
    return duration(seconds)


def either(words):
    """Return the words as alternatives: ['401', '403', '429'] -> '401, 403 or 429'."""
    words = list(words)
    if len(words) < 2:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]


def status_words(enabled, shadow):
    """Return how a rule acts now: 'enforced', 'shadow (counted, never refused)' or
    'disabled'."""
    if not enabled:
        return "disabled"
    return "shadow (counted, never refused)" if shadow else "enforced"
