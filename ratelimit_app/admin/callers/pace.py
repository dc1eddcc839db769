"""At the caller's recent pace, when does a quota or a prepaid balance run out?

An estimate, and said as one: the units a rule charged the caller over its recent hours
(history.py), spread evenly, carried forward from now. A calendar quota that would last past
its reset is said to last; a pace of nothing never runs out. ``now`` is the page's clock
(the Limiter's ``clock.wall_time()``, which tests set).
"""

import dataclasses
import datetime
import zoneinfo

from ...conf import get_config
from ...config.wording import count, duration

__all__ = ["Pace", "pace_of", "RunOut", "run_out", "day_text"]

HOUR_S = 3600


@dataclasses.dataclass(frozen=True)
class Pace:
    """``units`` charged over the last ``span_s`` seconds."""

    units: int
    span_s: float

    @property
    def per_s(self):
        return self.units / self.span_s if self.span_s > 0 else 0.0

    def words(self):
        """'1,200 in the last 3 hours', '25 in the last hour'."""
        hours = max(1, round(self.span_s / HOUR_S))
        span = "hour" if hours == 1 else duration(hours * HOUR_S)
        return f"{count(self.units)} in the last {span}"


def pace_of(hours, rule, now):
    """Return the :class:`Pace` of ``rule`` (a name) over ``hours`` (history rows, oldest
    first, each with its ``hour`` start and ``units`` by rule): from the start of the first
    hour that charged it to ``now``, at least an hour, so one busy minute is not taken for a
    day's pace."""
    charged = [row for row in hours if row["units"].get(rule)]
    if not charged:
        return Pace(0, 0.0)
    units = sum(row["units"][rule] for row in charged)
    return Pace(units, max(HOUR_S, now - charged[0]["hour"]))


@dataclasses.dataclass(frozen=True)
class RunOut:
    """When ``what`` runs out at ``pace``: ``at`` (unix s), or None when it does not before
    ``resets_at`` (or at all); ``text`` the sentence the page shows."""

    at: float | None
    text: str


def day_text(unix_s):
    """'23 December at 14:00', in CALENDAR_TIME_ZONE (the zone calendar quotas reset in)."""
    moment = datetime.datetime.fromtimestamp(
        unix_s, zoneinfo.ZoneInfo(get_config()["CALENDAR_TIME_ZONE"]))
    return f"{moment.day} {moment:%B} at {moment:%H:%M}"


def run_out(what, left, pace, now, resets_at=None):
    """Return the :class:`RunOut` of ``what`` ("10,000 a month", "the prepaid balance") with
    ``left`` units left at ``now``, at ``pace``, resetting at ``resets_at`` (None: never)."""
    if left <= 0:
        return RunOut(now, f"{what} is used up")
    if pace.per_s <= 0:
        return RunOut(None, f"at this pace (nothing charged lately), {what} does not run out")
    at = now + left / pace.per_s
    estimate = f"at this pace ({pace.words()})"
    if resets_at is not None and at >= resets_at:
        return RunOut(None, f"{estimate}, {what} lasts until it resets on {day_text(resets_at)}")
    return RunOut(at, f"{estimate}, {what} runs out on {day_text(at)} (an estimate)")
