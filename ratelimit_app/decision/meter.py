"""A metered request: admitted on an estimate, charged what it consumed once that is known.

An endpoint whose ``EndpointCost`` row is metered is admitted when every bucket holds the
estimate (the row's cost), as any request is. Its view then reports what it consumed, with
``request.ratelimit.charge(units)`` (calls add up: a stream reports each chunk) or the
``REPORTED_COST_HEADER`` response header, which the middleware reads and removes. When the
response is finished (sent, a stream exhausted, or the client gone) the Limiter settles the
difference on the buckets the request was charged its cost on: one more Redis call, none when
what was reported is the estimate. A request that reported nothing is charged the estimate; one
that reported less than the row's minimum is charged the minimum.

``Meter`` is that request's account. It exists only on allowed decisions of metered endpoints
(``Decision.meter``; None on every other request, which so costs nothing more).
"""

import logging
import operator
import threading

from ..conf import get_config

__all__ = ["Meter", "MAX_REPORTED_UNITS", "check_units", "charge_without_meter",
           "reported_header_units"]

logger = logging.getLogger("ratelimit_app")

# The most units one request may report: what a bucket's arithmetic in Redis (int64 units of
# tokens × milliseconds) can take whatever the rule.
MAX_REPORTED_UNITS = 2**40


def check_units(units):
    """Return ``units`` if it is what a view may report (a whole number from 0 to
    MAX_REPORTED_UNITS), else raise TypeError or ValueError saying what is wrong."""
    if type(units) is not int:
        # an integer type (numpy's too) is taken as its int; True is not a cost, nor is 2.5
        if isinstance(units, bool) or not hasattr(type(units), "__index__"):
            raise TypeError(f"charge() takes a whole number of units, not "
                            f"{type(units).__name__} {units!r}")
        units = operator.index(units)
    if not 0 <= units <= MAX_REPORTED_UNITS:
        raise ValueError(f"charge() takes 0 to {MAX_REPORTED_UNITS} units; got {units}")
    return units


class Meter:
    """The account of one metered request (see the module's docstring).

    ``buckets`` are those it was charged its cost on (``engine.settled_buckets``), ``estimate``
    the cost it was admitted for, ``minimum`` the least it is charged. ``alerts``: its
    snapshot has alert thresholds (a settle's levels are then checked against them). Reports
    may come from another thread than the one that settles (a streamed response's iterator):
    they are added under a lock."""

    __slots__ = ("buckets", "estimate", "minimum", "alerts", "reported", "settled", "_lock")

    def __init__(self, buckets, estimate, minimum, alerts=False):
        self.buckets = buckets
        self.estimate = estimate
        self.minimum = minimum
        self.alerts = alerts
        self.reported = None   # units reported so far; None: nothing reported
        self.settled = False   # the settle was taken (``close``): later reports are too late
        self._lock = threading.Lock()

    def __repr__(self):
        return (f"Meter(estimate={self.estimate}, minimum={self.minimum}, "
                f"reported={self.reported}, settled={self.settled})")

    def add(self, units):
        """Add ``units`` to what the request reported consuming. Returns False, and logs,
        when the request was settled already (a report after its response was finished)."""
        units = check_units(units)
        with self._lock:
            if self.settled:
                logger.warning("ratelimit_app: charge(%d) after the request was settled; not "
                               "charged", units)
                return False
            self.reported = units if self.reported is None else self.reported + units
            return True

    def cost(self):
        """Return what the request is charged: what it reported, at least the minimum; the
        estimate when it reported nothing."""
        reported = self.reported
        return self.estimate if reported is None else max(reported, self.minimum)

    def close(self):
        """Take the settle: return the units to charge beyond the estimate (negative: to give
        back), or None when it was taken already (the settle runs once)."""
        with self._lock:
            if self.settled:
                return None
            self.settled = True
            return self.cost() - self.estimate


def charge_without_meter(decision, units):
    """``Decision.charge`` on a decision without a meter: check ``units`` all the same (a bad
    value is the view's bug wherever it runs), and say why nothing is charged when the endpoint
    is not metered. Without Redis, when exempt, refused or unlimited, there is nothing to
    settle and nothing to say."""
    check_units(units)
    if decision.allowed and decision.policies and not decision.degraded:
        logger.warning("ratelimit_app: charge(%d) on endpoint %r, whose cost is not metered; "
                       "not charged (tick “metered” on its endpoint cost)", units,
                       decision.endpoint)


def reported_header_units(response):
    """Remove the REPORTED_COST_HEADER header from ``response`` (the client never sees it) and
    return the units it reported, or None when it is absent or not a whole number (logged:
    the request is then charged as if it had not been sent)."""
    name = get_config()["REPORTED_COST_HEADER"]
    if not name or name not in response:
        return None
    raw = response[name]
    del response[name]
    digits = raw.strip()
    if digits.isascii() and digits.isdigit() and len(digits) <= len(str(MAX_REPORTED_UNITS)):
        units = int(digits)
        if units <= MAX_REPORTED_UNITS:
            return units
    logger.warning("ratelimit_app: ignored %s response header %.40r (not a whole number of "
                   "units up to %d)", name, raw, MAX_REPORTED_UNITS)
    return None
