"""The choices and bounds of the quota configuration's rows: the kinds of limit, what a rule
counts, its modes, calendar periods and the numbers' limits.

Apart from ``models.py`` so that ``rule_kinds.py`` (what each kind of limit checks and how it
reads) can use them without importing the models; ``models.py`` re-exports every name here.
"""

import re

from django.db import models

__all__ = ["MAX_BUCKET_UNITS", "MAX_PERIOD_S", "RULE_NAME_RE", "MINIMUM_MESSAGES", "Mode",
           "Counts", "Kind", "MAX_CONCURRENCY", "MAX_CONCURRENCY_TIMEOUT_S", "CalendarPeriod",
           "NOMINAL_PERIOD_S", "FailureMode", "ALERT_MIN_PERIOD_S", "parse_alert_thresholds",
           "ListKind", "ListTarget"]

# Token math runs on doubles inside Redis Lua; burst x period in ms must stay an exact integer.
MAX_BUCKET_UNITS = 2**50
MAX_PERIOD_S = 366 * 24 * 3600
RULE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# What an operator reads when a number is below 1 (the admin forms show the same words).
MINIMUM_MESSAGES = {
    "rate": "The rate must be at least 1 token per period.",
    "period_s": "The period must be at least 1 second.",
    "burst": "The burst must be at least 1 token.",
    "cost": "The cost must be at least 1 token.",
}



class Mode(models.TextChoices):
    ENFORCE = "enforce", "Enforce"
    SHADOW = "shadow", "Shadow (count would-be denials, never deny)"


class Counts(models.TextChoices):
    REQUESTS = "requests", "Requests (each charged its cost)"
    FAILED_AUTH = "failed_auth", "Failed authentications (per client IP)"


class ListKind(models.TextChoices):
    DENY = "deny", "Deny (refuse every request)"
    ALLOW = "allow", "Allow (trusted: never banned)"


# (the values are protection/lists.py's TARGETS)
class ListTarget(models.TextChoices):
    IP = "ip", "Client IP or network"
    API_KEY = "api_key", "API key"
    USER = "user", "User (and the user's API keys)"
    TENANT = "tenant", "Tenant"
    USER_AGENT = "user_agent", "User-Agent containing"


class Kind(models.TextChoices):
    TOKEN_BUCKET = "token_bucket", "Token bucket (rate per period, up to a burst)"
    CALENDAR = "calendar", "Calendar quota (N per day or month, reset at the boundary)"
    CONCURRENCY = "concurrency", "Concurrency limit (at most N requests in flight)"
    CREDITS = "credits", "Prepaid credits (a balance that top-ups raise)"


# The most requests in flight a concurrency limit may allow per scope value, and its longest
# timeout (the deadline of a slot a crashed worker never released).
MAX_CONCURRENCY = 100_000
MAX_CONCURRENCY_TIMEOUT_S = 24 * 3600


class CalendarPeriod(models.TextChoices):
    DAY = "day", "Day (resets at midnight)"
    MONTH = "month", "Month (resets at midnight on the 1st)"


# The period_s a calendar quota stores (its real length varies: DST days, month lengths), so
# that the admin's lists and the number-based checks read it like any rule.
NOMINAL_PERIOD_S = {CalendarPeriod.DAY: 24 * 3600, CalendarPeriod.MONTH: 31 * 24 * 3600}


class FailureMode(models.TextChoices):
    DEFAULT = "default", "Project default (FAIL_OPEN setting)"
    OPEN = "open", "Allow requests"
    CLOSED = "closed", "Refuse requests"


# The shortest period of a token bucket that may carry alert thresholds: a bucket refilling
# faster crosses them all day long, and the alert (once per period-long window) would be noise.
ALERT_MIN_PERIOD_S = 3600


def parse_alert_thresholds(text):
    """Return the thresholds of ``text`` ("80,100": percent of the quota used) as a sorted
    tuple of distinct ints from 1 to 100; raise ValueError with an operator's message."""
    thresholds = set()
    for part in text.replace(" ", "").split(","):
        # (ASCII only: str.isdigit() is true of "²" and "①", which int() refuses)
        if not (part.isascii() and part.isdigit()) or not 1 <= int(part) <= 100:
            raise ValueError(f"“{part}” is not a percent from 1 to 100; write the thresholds "
                             f"as whole percents separated by commas, e.g. 80,100.")
        thresholds.add(int(part))
    if len(thresholds) > 10:
        raise ValueError("At most 10 thresholds per rule.")
    return tuple(sorted(thresholds))
