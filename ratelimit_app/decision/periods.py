"""Calendar periods: where a day or a month starts and ends in the configured time zone.

A calendar quota (``Rule.kind``) counts N units per day or per month and starts again at the
period's boundary in ``CALENDAR_TIME_ZONE``. Python computes the boundaries (time zones and
month lengths are easy here, not in Lua); take.lua decides with the Redis clock which period
"now" is in. The boundaries sent are those of the period holding this host's clock minus
``CLOCK_MARGIN_MS``: for a host whose clock is off by less than that, the period sent is the
one Redis is in or the one before it, and the script, seeing now >= next start, moves on. So
every app server agrees with the Redis clock, whatever its own says.
"""

import datetime
import functools
import zoneinfo
from typing import NamedTuple

from ..conf import get_config
from .clock import process_clock

__all__ = ["DAY", "MONTH", "CLOCK_MARGIN_MS", "Bounds", "bounds_at", "now_ms",
           "valid_time_zone"]

DAY, MONTH = "day", "month"
# how far an app server's clock may run ahead of Redis's and still agree on the period
CLOCK_MARGIN_MS = 5 * 60 * 1000


class Bounds(NamedTuple):
    """A period's start, the next period's start and the start after that (ms since the epoch)."""

    start_ms: int
    next_ms: int
    after_ms: int


def valid_time_zone(name):
    """Return True if ``name`` is an IANA time zone this Python knows."""
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        return False
    return True


def _period_starts(period, day, zone):
    """Return the local midnights starting the period holding ``day`` and the two after it."""
    if period == DAY:
        days = [day + datetime.timedelta(days=k) for k in range(3)]
    else:
        first = day.replace(day=1)
        days = [first]
        for _ in range(2):
            last = days[-1]
            days.append(last.replace(year=last.year + last.month // 12,
                                     month=last.month % 12 + 1))
    # a local midnight skipped by a DST change resolves forward (fold 0), as wall clocks do
    return [int(datetime.datetime.combine(d, datetime.time(), zone).timestamp() * 1000)
            for d in days]


@functools.lru_cache(maxsize=64)
def _bounds_of_day(period, day, zone_name):
    return Bounds(*_period_starts(period, day, zoneinfo.ZoneInfo(zone_name)))


def bounds_at(period, at_ms, zone_name=None):
    """Return the Bounds of the ``period`` (DAY or MONTH) holding ``at_ms`` in ``zone_name``
    (default: CALENDAR_TIME_ZONE)."""
    zone_name = zone_name or get_config()["CALENDAR_TIME_ZONE"]
    zone = zoneinfo.ZoneInfo(zone_name)
    day = datetime.datetime.fromtimestamp(at_ms / 1000, zone).date()
    bounds = _bounds_of_day(period, day, zone_name)
    if at_ms < bounds.start_ms:  # a day starting after midnight (DST at 00:00): the one before
        bounds = _bounds_of_day(period, day - datetime.timedelta(days=1), zone_name)
    return bounds


def now_ms():
    """Return "now" as the process's Limiter sees it: its clock's test time, else this host's."""
    return process_clock.now_ms()
