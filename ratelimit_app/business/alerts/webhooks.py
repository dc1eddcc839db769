"""Signed webhook deliveries from the outbox (``WebhookDelivery`` rows), sent by ``Sender``.

``manage.py ratelimit deliver`` runs a Sender in its own process: it claims due rows, POSTs each
row's ``body`` to its endpoint with a per-request timeout, and records the outcome. A receiver
that is down or answers other than 2xx is retried with exponential backoff and jitter until
``give_up_at`` (WEBHOOK_RETRY_FOR_S after the delivery was made, or re-sent), then the row is
marked failed. The request path never sends, and never waits for a receiver.

Claiming: ``select_for_update(skip_locked=True)`` picks rows no other sender is looking at (on
databases that have it, e.g. PostgreSQL), and a conditional UPDATE takes each one (status
``sending``, ``next_attempt_at`` = when the claim lapses): only the sender whose UPDATE changed
the row sends it, on any database. A sender that dies mid-send leaves the row ``sending``; it is
taken again when its claim lapses. Delivery is therefore at least once in that one case (a crash
between the receiver's 2xx and the row's update): receivers dedupe by ``X-Ratelimit-Delivery``.

Signature: ``X-Ratelimit-Signature: t=<unix seconds>,v1=<hex>``, where hex is the HMAC-SHA256,
keyed with the endpoint's secret, of ``"<t>.<raw body>"``. A receiver recomputes it and rejects
a ``t`` too far from its own clock (a replayed request keeps its old ``t``).
"""

import datetime
import hashlib
import hmac
import http.client
import json
import logging
import random
import time
import urllib.parse
from http import HTTPStatus

from django.db import transaction
from django.db.models import F, Q

from ...conf import get_config

__all__ = ["SIGNATURE_HEADER", "sign", "signature_header", "verify_signature", "alert_body",
           "first_attempt_times", "backoff_s", "Sender"]

logger = logging.getLogger("ratelimit_app")

SIGNATURE_HEADER = "X-Ratelimit-Signature"
# how long past its timeout a claimed delivery stays claimed before another sender may take it
CLAIM_MARGIN_S = 30
# deliveries claimed per round
BATCH_SIZE = 20
_PHRASES = {status.value for status in HTTPStatus}


def sign(secret, timestamp, body):
    """Return the hex HMAC-SHA256 of ``"<timestamp>.<body>"`` keyed with ``secret``."""
    message = str(int(timestamp)).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_header(secret, timestamp, body):
    """Return the X-Ratelimit-Signature value for ``body`` sent at ``timestamp``."""
    return f"t={int(timestamp)},v1={sign(secret, timestamp, body)}"


def verify_signature(secret, header, body, now=None, tolerance_s=300):
    """Return True if ``header`` signs ``body`` with ``secret`` and its ``t`` is within
    ``tolerance_s`` of ``now`` (what a receiver does; the docs show the same steps)."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
    except (ValueError, KeyError):
        return False
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), fields.get("v1", ""))


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


def post(url, body, headers, timeout_s):
    """POST ``body`` to ``url``; return the answer's status code. Redirects are answers, never
    followed. Raises OSError (refused, timed out, DNS) or ValueError (a URL it cannot use); the
    connection is closed either way."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" \
        else http.client.HTTPConnection
    connection = connection_class(parts.hostname, parts.port, timeout=timeout_s)
    try:
        path = parts.path or "/"
        connection.request("POST", f"{path}?{parts.query}" if parts.query else path, body=body,
                           headers=headers)
        response = connection.getresponse()
        response.read(64 * 1024)  # what a receiver says is not used; bounded
        return response.status
    finally:
        connection.close()


class Sender:
    """Sends due deliveries. ``clock`` returns unix seconds (tests pass their own)."""

    def __init__(self, clock=time.time, config=get_config, rng=random.random):
        self.clock = clock
        self.config = config
        self.rng = rng

    def claim(self, limit=BATCH_SIZE):
        """Take up to ``limit`` due deliveries for this sender. Returns the claimed rows."""
        from .models import DeliveryStatus, WebhookDelivery

        now = _now_dt(self.clock())
        lapse = _now_dt(self.clock() + float(self.config()["WEBHOOK_TIMEOUT_S"]) + CLAIM_MARGIN_S)
        due = Q(status__in=[DeliveryStatus.PENDING, DeliveryStatus.SENDING],
                next_attempt_at__lte=now)
        claimed = []
        with transaction.atomic():
            rows = list(WebhookDelivery.objects.select_for_update(skip_locked=True)
                        .filter(due).order_by("next_attempt_at", "id")
                        .values_list("id", "next_attempt_at")[:limit])
            for pk, seen_next in rows:
                # taken only if nobody took it since we read it
                if WebhookDelivery.objects.filter(pk=pk, next_attempt_at=seen_next).filter(due) \
                        .update(status=DeliveryStatus.SENDING, next_attempt_at=lapse):
                    claimed.append(pk)
        return list(WebhookDelivery.objects.filter(pk__in=claimed).select_related("endpoint")
                    .order_by("next_attempt_at", "id"))

    def send_due(self):
        """Claim and send the due deliveries, batch after batch, until none is due. Returns
        ``(sent, failed attempts)``."""
        sent = failed = 0
        while True:
            batch = self.claim()
            if not batch:
                return sent, failed
            for delivery in batch:
                if self.send(delivery):
                    sent += 1
                else:
                    failed += 1

    def send(self, delivery):
        """POST one claimed delivery and record the outcome. Returns True if the receiver
        answered 2xx."""
        from .models import DeliveryStatus, WebhookDelivery

        config = self.config()
        body = delivery.body.encode()
        now = self.clock()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "ratelimit_app-webhooks",
            "X-Ratelimit-Event": delivery.event,
            "X-Ratelimit-Delivery": str(delivery.pk),
            SIGNATURE_HEADER: signature_header(delivery.endpoint.secret, now, body),
        }
        code, error = None, ""
        try:
            code = post(delivery.endpoint.url, body, headers, float(config["WEBHOOK_TIMEOUT_S"]))
        except (OSError, ValueError, http.client.HTTPException) as exc:
            error = f"{type(exc).__name__}: {exc}"
        attempts = delivery.attempts + 1
        update = {"attempts": F("attempts") + 1, "last_status_code": code}
        if code is not None and 200 <= code < 300:
            update.update(status=DeliveryStatus.SENT, sent_at=_now_dt(self.clock()),
                          last_error="")
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

    def run(self, stop, on_round=None):
        """Send due deliveries every WEBHOOK_POLL_INTERVAL_S until ``stop`` (an Event) is set."""
        from django.db import connections

        while not stop.is_set():
            try:
                outcome = self.send_due()
                if on_round is not None:
                    on_round(outcome)
            except Exception as exc:  # the database is down: try again next round
                logger.warning("ratelimit_app: webhook sender round failed (%s: %s)",
                               type(exc).__name__, exc)
                connections.close_all()
            stop.wait(float(self.config()["WEBHOOK_POLL_INTERVAL_S"]))


def resend(deliveries, now_s=None):
    """Queue ``deliveries`` (a queryset) to be sent again now, with a fresh retry window.
    Returns how many."""
    from .models import DeliveryStatus

    next_at, give_up_at = first_attempt_times(now_s)
    return deliveries.update(status=DeliveryStatus.PENDING, next_attempt_at=next_at,
                             give_up_at=give_up_at)
