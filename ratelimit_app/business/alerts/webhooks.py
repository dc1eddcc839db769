"""Signed webhook deliveries from the outbox (``WebhookDelivery`` rows), sent by ``Sender``.

``manage.py ratelimit deliver`` runs a Sender in its own process: it claims due rows, POSTs each
row's ``body`` to its endpoint (transport.py: the whole exchange within WEBHOOK_TIMEOUT_S, to a
checked address only: destinations.py), and records the outcome. A receiver that is down, too
slow or answers other than 2xx is retried with exponential backoff and jitter until
``give_up_at`` (WEBHOOK_RETRY_FOR_S after the delivery was made, or re-sent), then the row is
marked failed. The request path never sends, and never waits for a receiver.

A disabled endpoint (``WebhookEndpoint.enabled`` off) receives nothing: no delivery is queued
for it, and the deliveries it had pending wait, unsent and not failed, until it is enabled
again (docs/howto/alerts.md).

Several receivers at once: the POSTs run in a pool of WEBHOOK_CONCURRENCY threads, one delivery
per endpoint at a time, so a slow receiver holds one thread and its own deliveries, never the
other endpoints'. The sender claims only as many rows as it has idle threads (nothing waits in
memory), and only the sender's own thread touches the database: the pool's threads POST.

Claiming: ``select_for_update(skip_locked=True)`` picks rows no other sender is looking at (on
databases that have it, e.g. PostgreSQL), and a conditional UPDATE takes each one (status
``sending``, ``next_attempt_at`` = when the claim lapses): only the sender whose UPDATE changed
the row sends it, on any database. A sender that dies mid-send leaves the row ``sending``; it is
taken again when its claim lapses. Delivery is therefore at least once in that one case (a crash
between the receiver's 2xx and the row's update): receivers dedupe by ``webhook-id``.

Signatures: signing.py (Standard Webhooks; and the former ``X-Ratelimit-Signature`` beside them
for endpoints whose scheme is "both").
"""

import concurrent.futures
import contextlib
import datetime
import json
import logging
import random
import time
from http import HTTPStatus

from django.db import connection, transaction
from django.db.models import F, Q

from ...conf import get_config
from .destinations import allowed_networks
from .signing import (
    SIGNATURE_HEADER,
    legacy_signature_header,
    standard_headers,
    verify_signature,
)
from .transport import post

__all__ = ["SIGNATURE_HEADER", "verify_signature", "alert_body", "first_attempt_times",
           "backoff_s", "Sender", "resend"]

logger = logging.getLogger("ratelimit_app")

# how long past its timeout a claimed delivery stays claimed before another sender may take it
CLAIM_MARGIN_S = 30
# due rows read per claim, from which one per idle endpoint is taken
SCAN_SIZE = 200
_PHRASES = {status.value for status in HTTPStatus}


def _iso(moment):
    return moment.astimezone(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def alert_body(alert):
    """Return the JSON text a QuotaAlert's deliveries send."""
    rule = alert.rule
    return json.dumps({
        "type": alert.event,
        "id": f"alert_{alert.pk}",
        "created": _iso(alert.created),
        "data": {
            "rule": rule.name, "scope": rule.scope, "kind": rule.kind,
            "plan": rule.plan.slug if rule.plan_id else None,
            "identity": alert.identity, "identity_key": alert.identity_key,
            "threshold_percent": alert.threshold, "used": alert.used, "limit": alert.limit,
            "period_start": _iso(alert.period_start),
            # a client-IP rule's alert counts every address (crossings.py); others: 1, []
            "callers": alert.callers,
            "top_callers": [{"identity": caller["identity"], "used": caller["used"]}
                            for caller in alert.top_callers],
        },
    }, separators=(",", ":"))


def _now_dt(now_s):
    return datetime.datetime.fromtimestamp(now_s, datetime.timezone.utc)


def first_attempt_times(now_s=None, config=None, delay_s=0.0):
    """Return ``(next_attempt_at, give_up_at)`` of a new (or re-sent) delivery, first sent
    ``delay_s`` from now."""
    config = config or get_config()
    now_s = (time.time() if now_s is None else now_s) + delay_s
    return _now_dt(now_s), _now_dt(now_s + float(config["WEBHOOK_RETRY_FOR_S"]))


def backoff_s(attempts, config, rng=random.random):
    """Return the seconds to wait before attempt ``attempts + 1``: the base doubled per attempt
    made, capped at the max, times a random 0.5–1 (so receivers coming back are not hit by every
    sender at once)."""
    base, most = float(config["WEBHOOK_BACKOFF_BASE_S"]), float(config["WEBHOOK_BACKOFF_MAX_S"])
    return min(most, base * 2 ** max(0, attempts - 1)) * (0.5 + rng() / 2)


class Sender:
    """Sends due deliveries. ``clock`` returns unix seconds (tests pass their own);
    ``resolve`` is ``socket.getaddrinfo``'s shape (tests pass their own DNS)."""

    def __init__(self, clock=time.time, config=get_config, rng=random.random, resolve=None):
        self.clock = clock
        self.config = config
        self.rng = rng
        self.resolve = resolve

    def claim(self, limit, busy_endpoints=()):
        """Take up to ``limit`` due deliveries for this sender, at most one per endpoint and
        none of ``busy_endpoints`` (ids). Returns the claimed rows, with their endpoints."""
        from .models import DeliveryStatus, WebhookDelivery

        now = _now_dt(self.clock())
        lapse = _now_dt(self.clock() + float(self.config()["WEBHOOK_TIMEOUT_S"]) + CLAIM_MARGIN_S)
        # a disabled endpoint receives nothing: its deliveries wait until it is enabled again
        due = Q(status__in=[DeliveryStatus.PENDING, DeliveryStatus.SENDING],
                next_attempt_at__lte=now, endpoint__enabled=True)
        claimed, endpoints = [], set(busy_endpoints)
        rows = WebhookDelivery.objects.filter(due).exclude(endpoint_id__in=endpoints)
        # skipping locked rows needs a transaction; without it (SQLite) a transaction would
        # only fail as "database is locked" when its read turns into a write beside another
        # sender's: each conditional UPDATE alone then waits for the lock
        locking = connection.features.has_select_for_update_skip_locked
        with transaction.atomic() if locking else contextlib.nullcontext():
            if locking:
                rows = rows.select_for_update(skip_locked=True)
            rows = list(rows.order_by("next_attempt_at", "id")
                        .values_list("id", "next_attempt_at", "endpoint_id")[:SCAN_SIZE])
            for pk, seen_next, endpoint_id in rows:
                if len(claimed) >= limit:
                    break
                if endpoint_id in endpoints:
                    continue
                # taken only if nobody took it since we read it
                if WebhookDelivery.objects.filter(pk=pk, next_attempt_at=seen_next).filter(due) \
                        .update(status=DeliveryStatus.SENDING, next_attempt_at=lapse):
                    claimed.append(pk)
                    endpoints.add(endpoint_id)
        return list(WebhookDelivery.objects.filter(pk__in=claimed).select_related("endpoint")
                    .order_by("next_attempt_at", "id"))

    def send_due(self):
        """Claim and send the due deliveries until none is due and none is in flight. Returns
        ``(sent, failed attempts)``."""
        counts = [0, 0]
        with self._pool() as pool:
            in_flight = {}
            while self._dispatch(pool, in_flight) or in_flight:
                self._collect(in_flight, counts, wait_s=None)
        return tuple(counts)

    def run(self, stop, on_round=None):
        """Send due deliveries until ``stop`` (an Event) is set, looking for new ones every
        WEBHOOK_POLL_INTERVAL_S (and whenever a POST ends); ``on_round`` is called after each
        round with ``(sent, failed attempts)`` so far. The POSTs in flight when ``stop`` is set
        are finished and recorded."""
        from django.db import connections

        counts = [0, 0]
        with self._pool() as pool:
            in_flight = {}
            while not stop.is_set():
                poll_s = float(self.config()["WEBHOOK_POLL_INTERVAL_S"])
                try:
                    self._dispatch(pool, in_flight)
                    if in_flight:
                        self._collect(in_flight, counts, wait_s=poll_s)
                    else:
                        stop.wait(poll_s)
                    if on_round is not None:
                        on_round(tuple(counts))
                except Exception as exc:  # the database is down: try again next round
                    logger.warning("ratelimit_app: webhook sender round failed (%s: %s)",
                                   type(exc).__name__, exc)
                    connections.close_all()
                    stop.wait(poll_s)
            try:
                while in_flight:
                    self._collect(in_flight, counts, wait_s=None)
            except Exception as exc:  # not recorded: their claims lapse and they are sent again
                logger.warning("ratelimit_app: webhook sender stopped before recording %d "
                               "deliveries (%s: %s)", len(in_flight), type(exc).__name__, exc)

    def _pool(self):
        workers = max(1, int(self.config()["WEBHOOK_CONCURRENCY"]))
        return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="webhook-post")

    def _dispatch(self, pool, in_flight):
        """Claim rows for the pool's idle threads (endpoints in flight left out) and start
        their POSTs. Returns how many it started."""
        config = self.config()
        idle = max(1, int(config["WEBHOOK_CONCURRENCY"])) - len(in_flight)
        if idle <= 0:
            return 0
        batch = self.claim(idle, {delivery.endpoint_id for delivery in in_flight.values()})
        for delivery in batch:
            in_flight[pool.submit(self.exchange, delivery, config)] = delivery
        return len(batch)

    def _collect(self, in_flight, counts, wait_s):
        """Wait (up to ``wait_s``; None: until one ends) for POSTs to end; record them."""
        done, _ = concurrent.futures.wait(in_flight, timeout=wait_s,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        config = self.config()
        for future in done:
            delivery = in_flight.pop(future)
            counts[0 if self.record(delivery, *future.result(), config) else 1] += 1

    def headers(self, delivery, timestamp):
        """Return the headers of one attempt at ``delivery`` made at ``timestamp``."""
        from .models import SignatureScheme

        endpoint, body = delivery.endpoint, delivery.body.encode()
        headers = {"Content-Type": "application/json", "User-Agent": "ratelimit_app-webhooks",
                   **standard_headers(endpoint.secret, delivery.pk, timestamp, body)}
        if endpoint.signature_scheme == SignatureScheme.BOTH:
            headers.update({
                "X-Ratelimit-Event": delivery.event, "X-Ratelimit-Delivery": str(delivery.pk),
                SIGNATURE_HEADER: legacy_signature_header(endpoint.secret, timestamp, body)})
        return headers

    def exchange(self, delivery, config):
        """POST ``delivery`` (no database access: the pool's threads run this). Returns
        ``(status code or None, error text)``."""
        options = {} if self.resolve is None else {"resolve": self.resolve}
        try:
            code = post(delivery.endpoint.url, delivery.body.encode(),
                        self.headers(delivery, self.clock()), float(config["WEBHOOK_TIMEOUT_S"]),
                        allowed_networks(config), **options)
        except (OSError, ValueError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
        return code, ""

    def record(self, delivery, code, error, config):
        """Store the outcome of one attempt at ``delivery``. Returns True if it was a 2xx."""
        from .models import DeliveryStatus, WebhookDelivery

        now = self.clock()
        attempts = delivery.attempts + 1
        update = {"attempts": F("attempts") + 1, "last_status_code": code}
        if code is not None and 200 <= code < 300:
            update.update(status=DeliveryStatus.SENT, sent_at=_now_dt(now), last_error="")
            delivered = True
        else:
            if not error:
                error = f"HTTP {code} {HTTPStatus(code).phrase}" if code in _PHRASES \
                    else f"HTTP {code}"
            retry_at = now + backoff_s(attempts, config, self.rng)
            gave_up = _now_dt(retry_at) > delivery.give_up_at
            update.update(last_error=error[:500],
                          status=DeliveryStatus.FAILED if gave_up else DeliveryStatus.PENDING,
                          next_attempt_at=_now_dt(retry_at))
            delivered = False
            logger.info("ratelimit_app: webhook delivery %s to %s failed (attempt %d): %s",
                        delivery.pk, delivery.endpoint, attempts, error)
        # only while still ours (a re-send from the admin meanwhile keeps its own state)
        WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.SENDING) \
            .update(**update)
        return delivered


def resend(deliveries, now_s=None):
    """Queue ``deliveries`` (a queryset) to be sent again now, with a fresh retry window.
    Returns how many."""
    from .models import DeliveryStatus

    next_at, give_up_at = first_attempt_times(now_s)
    return deliveries.update(status=DeliveryStatus.PENDING, next_attempt_at=next_at,
                             give_up_at=give_up_at)
