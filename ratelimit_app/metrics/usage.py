"""Usage records for billing, the in-process part: per caller, rule and calendar day, the units
its buckets charged and the requests allowed and refused.

The Recorder counts every decision it sees (not a sample) by *shape*: ``(day, caller,
allowed, rule names, per-rule costs)`` -> number of decisions (a refused one holds the rules
that refused it in place of its costs), one dict increment per decision on the request path.
``usage_counts`` expands the shapes into records off it (the flush thread). Why the numbers equal what the buckets charged: a decision is all or nothing (one
script call on a single node; on a cluster a refused multi-group decision refunds the groups
that debited), so an allowed decision charged each of its buckets that bucket's cost
(``PolicyStatus.cost``: an endpoint rule counts the call) and a refused one charged nothing.

Callers: an API key (``key:<id>``) or a signed-in user (``user:<id>``), with its tenant;
anonymous callers are counted together per tenant as ``anonymous`` (their IP addresses are not
billing identities, and one row per address would let a client grow the table without bound).
Decisions that charged no bucket are not usage: exempt callers, requests no rule applies to,
and requests decided without Redis (fail-open or fail-closed).
"""

import datetime
import operator
import zoneinfo
from collections import defaultdict

__all__ = ["ANONYMOUS", "USAGE_METRICS", "DayClock", "usage_caller", "usage_counts"]

ANONYMOUS = "anonymous"
USAGE_METRICS = ("units", "allowed", "refused")

cost_of = operator.attrgetter("cost")  # a PolicyStatus's; in C, for map()


class DayClock:
    """The calendar day of a unix time in CALENDAR_TIME_ZONE, as ``YYYY-MM-DD``.

    The day last asked for is kept with its bounds, so the usual call is two comparisons; a
    time outside them (midnight passed, or a test clock jumping) looks the day up again.
    ``time_zone`` returns the zone's name (read again at each look-up).
    """

    __slots__ = ("_time_zone", "_start_s", "_end_s", "_day")

    def __init__(self, time_zone):
        self._time_zone = time_zone
        self._start_s = self._end_s = 0.0
        self._day = ""

    def day_of(self, now_s):
        """Return the day (``YYYY-MM-DD``) holding unix time ``now_s``."""
        if self._start_s <= now_s < self._end_s:
            return self._day
        zone = zoneinfo.ZoneInfo(self._time_zone())
        day = datetime.datetime.fromtimestamp(now_s, zone).date()
        start = datetime.datetime.combine(day, datetime.time(), zone).timestamp()
        end = datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time(),
                                        zone).timestamp()
        # a day that starts after midnight (DST at 00:00) is still this date: keep the bounds
        # that hold now_s, so the next call does not look it up again
        self._start_s, self._end_s, self._day = min(start, now_s), end, day.isoformat()
        return self._day


def usage_caller(identity):
    """Return ``(ref, tenant, display)`` of the caller a decision's usage is recorded for."""
    tenant = identity.tenant or ""
    if identity.kind in ("key", "user"):
        return identity.ref, tenant, identity.display
    return ANONYMOUS, tenant, ANONYMOUS


def usage_counts(shapes):
    """Return ``{(day, ref, tenant, rule): [units, allowed, refused, display]}`` that the
    decision shapes ``{(day, caller, allowed, names, costs): decisions}`` add up to (``caller``
    as ``usage_caller`` gives it; ``costs``: each rule's, in the order of ``names``; for a refusal
    the names of the rules that refused it, unused here)."""
    records = defaultdict(lambda: [0, 0, 0, ""])
    for (day, (ref, tenant, display), allowed, names, costs), decisions in shapes.items():
        for index, name in enumerate(names):
            record = records[(day, ref, tenant, name)]
            if allowed:
                record[0] += costs[index] * decisions
                record[1] += decisions
            else:
                record[2] += decisions
            record[3] = display
    return dict(records)
