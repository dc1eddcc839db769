"""Quota alerts: learn threshold crossings from the levels a decision already has, store each once.

On the request path (``Limiter._conclude``), only for snapshots with a rule carrying
``alert_thresholds`` and only for allowed requests: ``crossings`` compares, per bucket of such a
rule, the level the Lua call returned after this request's debit with each threshold's mark. A
threshold of p % is reached when the units used, ``capacity - level``, are at or above
``ceil(capacity × p / 100)``. A few integer comparisons, no Redis call, no database; the
``AlertQueue`` queues a threshold reached in a period the first time this process sees it
(``ReportedCrossings``, bounded), so a caller past 80 % is reported once, not on every request.
Reached, not crossed by this request: when the reply of the request that crossed is lost (a
timeout, a failover), that request is decided by the fail mode and no worker sees its levels;
the caller's next allowed request reports the threshold instead. A crossing's ``used`` is the
usage the crossing request left, or the threshold's own mark when it was reached earlier: a
worker racing the crossing one then reports no later usage than the crossing's (the same, for
requests of one unit).

Off the request path, the queue's thread stores the crossings (``store_crossings``): one
``QuotaAlert`` row each, whose unique constraint on (rule, identity key, threshold, period start)
keeps exactly one row however many workers, or re-crossings of a refilled token bucket, report
it; with the row, in the same transaction, one ``WebhookDelivery`` per subscribed endpoint (the
outbox ``manage.py ratelimit deliver`` sends). The signal ``quota_threshold_crossed`` is sent
once per stored row, by the process that stored it.

A client-IP rule is the exception: addresses cost a client nothing (a /64 per subscriber, and
many of them), so one row per address would let a client write rows and webhook deliveries
without bound. Its crossings are stored in one row per rule, threshold and period for every
address (``EVERY_ADDRESS_KEY``): the first crossing makes it, later ones add to its count of
callers and its few top callers, and its deliveries wait ALERTS_AGGREGATE_S, rewritten by
each crossing until sent, so that one delivery says how many addresses crossed. The count is
what the workers report: an address seen by two workers in one period may be counted twice
(unless it is among the top callers).

Periods: a calendar quota's day or month; a token bucket's window of one period aligned to the
epoch (a bucket of period 1 h alerts at most once per threshold per clock hour, UTC).
"""

import atexit
import logging
import threading
import weakref
from collections import deque
from datetime import datetime, timezone
from typing import NamedTuple

from django.db import IntegrityError, transaction
from django.db.models import F
from django.dispatch import Signal

from ...decision import periods
from ...decision.scopes import Scope
from ...process.background import WorkerThread
from .drains import drain_at_exit, drain_logged

__all__ = ["quota_threshold_crossed", "Crossing", "crossings", "ReportedCrossings", "AlertQueue",
           "store_crossings"]

logger = logging.getLogger("ratelimit_app")

# Sent once per stored QuotaAlert, with ``alert`` (the row), by the process that stored it.
quota_threshold_crossed = Signal()


class Crossing(NamedTuple):
    """One threshold a caller's usage reached (units: tokens, or a calendar quota's units;
    ``used``: see ``crossings``)."""

    rule_id: int
    identity_key: str
    identity: str
    threshold: int
    period_start_ms: int
    used: int
    limit: int
    # a client-IP rule's: stored in its rule's one row for every address (store_crossings)
    aggregate: bool = False


def crossings(buckets, statuses, identity, now_ms, tokens=None):
    """Return the Crossings of the thresholds an allowed request's buckets have reached, at
    ``statuses`` (in the buckets' order) at ``now_ms``; usually (). ``tokens``: what the call
    took from each bucket (default: the request's cost; a settle passes what it added)."""
    found = ()
    for bucket, status in zip(buckets, statuses):
        thresholds = bucket.rule.alerts
        if not thresholds or status.short or bucket.rule.credits:
            # short: this bucket was not debited; a credit balance's thresholds are of its last
            # top-up, which the checkpoint compares (business/credits/alerts.py)
            continue
        capacity, level = bucket.capacity_units, status.level_units
        before = level + (bucket.cost_units if tokens is None else tokens * bucket.period_ms)
        for percent in thresholds:
            # the level at which ``percent`` of the capacity is used (rounded up)
            mark = capacity + (capacity * percent // -100)
            if level <= mark:
                # crossed by this request: the usage it left; reached before it (a request
                # whose reply was lost, or another worker's): the threshold's own mark
                at_level = level if mark < before else mark
                found += (_crossing(bucket, status, identity, percent, now_ms, at_level),)
    return found


def _crossing(bucket, status, identity, percent, now_ms, at_level):
    rule, unit = bucket.rule, bucket.period_ms  # a token's units (1 for a calendar quota)
    if rule.calendar:
        # the status's period ends ``reset_s`` (rounded up) from now: a moment just before
        # that end lies in it, whichever period Redis counted the request in
        inside = now_ms + status.reset_s * 1000 - 1500
        start_ms = periods.bounds_at(rule.calendar, inside).start_ms
    else:
        start_ms = now_ms - now_ms % (rule.period_s * 1000)
    used = -((at_level - bucket.capacity_units) // unit)
    display = f"{identity.ref} ({identity.display})" if identity is not None else ""
    return Crossing(rule.id, status.key, display[:300], percent, start_ms, used,
                    bucket.capacity_units // unit, rule.scope == Scope.IP)


# Thresholds reached that a process remembers having queued (see ReportedCrossings).
MAX_REPORTED_REMEMBERED = 10_000


class ReportedCrossings:
    """The (rule, identity key, threshold, period) this process has queued, so that a caller
    past a threshold is queued once per period, not once per request. Bounded (its keys come
    from request input): when full it starts afresh, and what it forgot is queued once more,
    which the database's unique constraint stores once anyway."""

    def __init__(self, capacity=MAX_REPORTED_REMEMBERED):
        self.capacity = capacity
        self._seen = set()

    def new(self, found):
        """Return the Crossings of ``found`` not seen before, and remember them."""
        seen, fresh = self._seen, ()
        for crossing in found:
            key = (crossing.rule_id, crossing.identity_key, crossing.threshold,
                   crossing.period_start_ms)
            if key not in seen:
                if len(seen) >= self.capacity:
                    seen.clear()
                seen.add(key)
                fresh += (crossing,)
        return fresh

    def forget(self):
        self._seen.clear()


class AlertQueue:
    """This process's crossings waiting to be stored, and the thread that stores them.

    ``note`` runs on the request path; ``drain`` (the thread, every ALERTS_DRAIN_INTERVAL_S or
    when woken by a crossing; tests call it directly) stores what is queued. While the database
    fails, crossings stay queued, up to ALERTS_QUEUE_SIZE; past that, new ones are dropped and
    counted in ``dropped``.
    """

    def __init__(self, now_ms, config, *, autostart=True, drain_at_exit=None):
        self.now_ms = now_ms      # callable: the decision's clock in ms
        self.config = config      # callable: the RATELIMIT_APP mapping
        self.autostart = autostart
        self.dropped = 0
        self.stored = 0
        self._queue = deque()
        self.reported = ReportedCrossings()
        self._thread = WorkerThread(self._drain_logged, "ratelimit-alerts",
                                    every_s=lambda: self.config()["ALERTS_DRAIN_INTERVAL_S"],
                                    final_round=True)
        self._drain_lock = threading.Lock()
        if autostart if drain_at_exit is None else drain_at_exit:
            # a worker stopped gracefully (a deploy, gunicorn's max_requests) stores what it
            # holds; a weak reference, so a replaced Limiter's queue can still be collected
            atexit.register(_drain_at_exit, weakref.ref(self))

    def note(self, buckets, statuses, identity, tokens=None):
        """Queue the thresholds an allowed decision (or a settle of ``tokens`` more) reached
        that this process has not queued in their period yet (see ``crossings``)."""
        found = crossings(buckets, statuses, identity, self.now_ms(), tokens)
        if found:
            found = self.reported.new(found)
            if found:
                self.put(found)

    def put(self, found):
        """Queue ``found`` crossings (dropped and counted when the queue is full)."""
        if len(self._queue) + len(found) > self.config()["ALERTS_QUEUE_SIZE"]:
            self.dropped += len(found)
            logger.warning("ratelimit_app: alert queue full; %d crossing(s) dropped", len(found))
            return
        self._queue.extend(found)
        if self.autostart:
            self._thread.wake()

    def pending(self):
        """Return how many crossings wait to be stored."""
        return len(self._queue)

    def drain(self):
        """Store every queued crossing. Returns the QuotaAlert rows this call stored (not those
        another process stored first). On a database error the crossings are queued again and
        the error raised."""
        with self._drain_lock:
            taken = []
            while self._queue:
                taken.append(self._queue.popleft())
            if not taken:
                return []
            try:
                stored = store_crossings(taken)
            except Exception:
                self._queue.extendleft(reversed(taken))
                raise
            self.stored += len(stored)
            return stored

    def _drain_logged(self):
        drain_logged(self, "alerts not stored yet")

    def stop(self):
        """Stop the thread, after a last drain (what it cannot store stays queued)."""
        self._thread.stop()


def _drain_at_exit(queue_ref):
    drain_at_exit(queue_ref, "alert crossing(s)")


def store_crossings(found):
    """Store ``found`` crossings: a QuotaAlert row each, unless one exists for the same rule,
    identity key, threshold and period, with its webhook deliveries; a client-IP rule's in its
    one row for every address. Returns the rows made here; sends ``quota_threshold_crossed``
    once for each."""
    from .models import QuotaAlert, WebhookEndpoint

    endpoints = list(WebhookEndpoint.objects.filter(enabled=True))
    stored = []
    groups = {}
    for crossing in found:
        if crossing.aggregate:
            groups.setdefault((crossing.rule_id, crossing.threshold, crossing.period_start_ms),
                              []).append(crossing)
        else:
            alert = _store_one(crossing, endpoints)
            if alert is not None:
                stored.append(alert)
    for group in groups.values():
        alert = _store_aggregate(group, endpoints)
        if alert is not None:
            stored.append(alert)
    for alert in stored:
        for receiver, result in quota_threshold_crossed.send_robust(
                sender=QuotaAlert, alert=alert):
            if isinstance(result, Exception):
                logger.error("ratelimit_app: a quota_threshold_crossed receiver (%r) failed: "
                             "%s: %s", receiver, type(result).__name__, result)
    return stored


def _period_start(crossing):
    return datetime.fromtimestamp(crossing.period_start_ms / 1000, timezone.utc)


def _store_one(crossing, endpoints):
    """Store one crossing's row and deliveries; None if it was stored already (by another
    worker, or earlier in this period)."""
    from .models import QuotaAlert

    try:
        # one transaction per row: a duplicate rolls back its own savepoint only (the
        # unique constraint decides, so two workers racing store one row)
        with transaction.atomic():
            alert = QuotaAlert.objects.create(
                rule_id=crossing.rule_id, identity_key=crossing.identity_key,
                identity=crossing.identity, threshold=crossing.threshold,
                period_start=_period_start(crossing), used=crossing.used, limit=crossing.limit)
            _make_deliveries(alert, endpoints)
    except IntegrityError:
        return None
    return alert


def _make_deliveries(alert, endpoints, delay_s=0.0):
    from .models import WebhookDelivery
    from .webhooks import alert_body, first_attempt_times

    subscribed = [e for e in endpoints if alert.event in e.event_list()]
    if subscribed:
        body = alert_body(alert)
        next_at, give_up_at = first_attempt_times(delay_s=delay_s)
        WebhookDelivery.objects.bulk_create([
            WebhookDelivery(endpoint=e, alert=alert, event=alert.event, body=body,
                            next_attempt_at=next_at, give_up_at=give_up_at)
            for e in subscribed])


def _top_callers(kept, group):
    """Return the TOP_CALLERS_KEPT callers of ``kept`` (the row's list) and ``group`` that used
    the most, each once, and how many callers of ``group`` are new to ``kept``."""
    from .models import TOP_CALLERS_KEPT

    by_key = {caller["identity_key"]: caller for caller in kept}
    new = 0
    for crossing in group:
        known = by_key.get(crossing.identity_key)
        if known is None:
            new += 1
        elif known["used"] >= crossing.used:
            continue
        by_key[crossing.identity_key] = {"identity": crossing.identity,
                                         "identity_key": crossing.identity_key,
                                         "used": crossing.used}
    ranked = sorted(by_key.values(), key=lambda caller: (-caller["used"], caller["identity"]))
    return ranked[:TOP_CALLERS_KEPT], new


def _store_aggregate(group, endpoints):
    """Add ``group``, crossings of one client-IP rule, threshold and period, to the row for
    every address (made by the first; its deliveries wait ALERTS_AGGREGATE_S, and are rewritten
    until sent). Returns the row if it was made here, else None."""
    from ...conf import get_config
    from .models import EVERY_ADDRESS_KEY, DeliveryStatus, QuotaAlert, WebhookDelivery
    from .webhooks import alert_body

    first = group[0]
    key = {"rule_id": first.rule_id, "identity_key": EVERY_ADDRESS_KEY,
           "threshold": first.threshold, "period_start": _period_start(first)}
    top, new = _top_callers([], group)
    try:
        with transaction.atomic():
            alert = QuotaAlert.objects.create(
                **key, identity=top[0]["identity"], used=top[0]["used"], limit=first.limit,
                callers=new, top_callers=top)
            _make_deliveries(alert, endpoints,
                             delay_s=float(get_config()["ALERTS_AGGREGATE_S"]))
        return alert
    except IntegrityError:
        pass  # made already: add to it
    with transaction.atomic():
        # write first, then read: the no-op UPDATE locks the row on any database and waits for
        # another writer, where a read that turns into a write fails at once on SQLite
        # ("database is locked") when another process writes beside it
        QuotaAlert.objects.filter(**key).update(callers=F("callers"))
        alert = QuotaAlert.objects.get(**key)
        top, new = _top_callers(alert.top_callers, group)
        if not new and top == alert.top_callers:
            return None
        alert.callers += new
        alert.top_callers = top
        alert.identity, alert.used = top[0]["identity"], top[0]["used"]
        alert.save(update_fields=["callers", "top_callers", "identity", "used"])
        # what is not sent yet says so too (a delivery a sender took meanwhile stays as sent)
        WebhookDelivery.objects.filter(alert=alert, status=DeliveryStatus.PENDING,
                                       attempts=0).update(body=alert_body(alert))
    return None
