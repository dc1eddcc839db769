"""Webhook deliveries (business/alerts/webhooks.py, ``manage.py ratelimit deliver``) against a real
HTTP receiver
started by the test: signed bodies, retries with backoff while the receiver is down, failure
after the retry window, claims that keep two senders apart, a timeout for a receiver that does
not answer, and the admin's re-send."""

import datetime
import hashlib
import hmac
import io
import json
import threading
import time

import pytest
from django.core.management import call_command
from django.test import Client

from ratelimit_app.business.alerts.models import (
    DeliveryStatus,
    QuotaAlert,
    WebhookDelivery,
    WebhookEndpoint,
)
from ratelimit_app.business.alerts.webhooks import (
    CLAIM_MARGIN_S,
    Sender,
    backoff_s,
    resend,
    signature_header,
    verify_signature,
)
from ratelimit_app.models import Rule

from ..helpers import limiter, use_fake_clock

pytestmark = pytest.mark.django_db
HOUR_START_MS = 1_699_999_200_000


@pytest.fixture(autouse=True)
def deliveries_due_at_once(settings):
    """The outbox's mechanics are tested here: a client-IP rule's deliveries are due at once
    rather than after ALERTS_AGGREGATE_S (test_alerts.py tests the wait)."""
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "ALERTS_AGGREGATE_S": 0}


def alert_with_deliveries(url, thresholds="80,100", rate=5):
    """Make a calendar quota cross its thresholds through the request path; return the
    endpoint (its deliveries are in the outbox)."""
    endpoint = WebhookEndpoint.objects.create(name="receiver", url=url)
    Rule.objects.create(name="daily", scope="ip", kind="calendar", calendar_period="day",
                        rate=rate, period_s=86400, burst=rate, alert_thresholds=thresholds)
    use_fake_clock(now_ms=HOUR_START_MS)
    client = Client()
    for _ in range(rate):
        assert client.get("/hello/").status_code == 200
    assert len(limiter().alerts.drain()) == len(thresholds.split(","))
    return endpoint


def deliver_once():
    out = io.StringIO()
    call_command("ratelimit", "deliver", "--once", stdout=out)
    return out.getvalue()


def verified_by_hand(secret, headers, body):
    """The receiver's check as the docs spell it: HMAC-SHA256 of "<t>.<body>"."""
    fields = dict(part.split("=", 1) for part in headers["X-Ratelimit-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{fields['t']}.".encode() + body,
                        hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields["v1"]) and abs(time.time() - int(fields["t"])) < 60


def docs_verify():
    """The receiver's ``verify`` function from docs/howto/alerts.md, run as printed."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "alerts.md").read_text()
    code = next(block for block in text.split("```python")[1:] if "def verify(" in block)
    namespace = {}
    exec(code.split("```")[0], namespace)  # noqa: S102  (our own docs)
    return namespace["verify"]


def test_the_docs_receiver_snippet_accepts_a_real_delivery_and_rejects_a_forgery(receiver):
    endpoint = alert_with_deliveries(receiver.url, thresholds="100")
    assert Sender().send_due() == (1, 0)
    [got] = receiver.received
    verify = docs_verify()
    signature = got.headers["X-Ratelimit-Signature"]
    assert verify(endpoint.secret, signature, got.body)
    assert not verify(endpoint.secret, signature, got.body.replace(b"100", b"101"))
    assert not verify("whsec_wrong", signature, got.body)
    stale = signature_header(endpoint.secret, time.time() - 3600, got.body)
    assert not verify(endpoint.secret, stale, got.body)  # a replay an hour later


def test_a_signature_verifies_and_a_replay_or_a_changed_body_does_not():
    header = signature_header("whsec_x", 1_000_000, b'{"a":1}')
    assert verify_signature("whsec_x", header, b'{"a":1}', now=1_000_100)
    assert not verify_signature("whsec_x", header, b'{"a":2}', now=1_000_100)
    assert not verify_signature("whsec_y", header, b'{"a":1}', now=1_000_100)
    assert not verify_signature("whsec_x", header, b'{"a":1}', now=1_000_000 + 301)  # replayed
    assert not verify_signature("whsec_x", "garbage", b'{"a":1}', now=1_000_000)


def test_deliver_once_sends_each_delivery_signed_then_nothing_more(receiver):
    endpoint = alert_with_deliveries(receiver.url)
    assert deliver_once() == "2 deliveries sent, 0 attempts failed (retried later).\n"
    assert len(receiver.received) == 2
    for got in receiver.received:
        assert verified_by_hand(endpoint.secret, got.headers, got.body)
        assert got.headers["Content-Type"] == "application/json"
        delivery = WebhookDelivery.objects.get(pk=got.headers["X-Ratelimit-Delivery"])
        assert got.body == delivery.body.encode() and got.headers["X-Ratelimit-Event"] == \
            delivery.event
    bodies = sorted((json.loads(got.body) for got in receiver.received),
                    key=lambda b: b["data"]["threshold_percent"])
    assert [(b["type"], b["data"]["threshold_percent"], b["data"]["used"], b["data"]["limit"])
            for b in bodies] == [("quota.threshold_crossed", 80, 4, 5),
                                 ("quota.exhausted", 100, 5, 5)]
    assert bodies[0]["data"]["rule"] == "daily" and bodies[0]["data"]["identity"].startswith(
        "ip:127.0.0.1")
    assert bodies[0]["data"]["period_start"] == "2023-11-14T00:00:00Z"
    assert set(WebhookDelivery.objects.values_list("status", "attempts", "last_status_code")) \
        == {("sent", 1, 200)}
    # a new sender (a restart) finds nothing to send
    assert deliver_once().startswith("0 deliveries sent")
    assert len(receiver.received) == 2


def test_a_receiver_that_was_down_gets_the_delivery_later(receiver):
    alert_with_deliveries(receiver.url, thresholds="100")
    receiver.stop()
    before = time.time()
    assert deliver_once() == "0 deliveries sent, 1 attempt failed (retried later).\n"
    delivery = WebhookDelivery.objects.get()
    assert delivery.status == "pending" and delivery.attempts == 1
    assert "Connection refused" in delivery.last_error and delivery.last_status_code is None
    wait = delivery.next_attempt_at.timestamp() - before
    assert 5 - 1 <= wait <= 10 + 1  # the base (10 s) with jitter 0.5–1
    assert deliver_once().startswith("0 deliveries sent, 0 attempts")  # not due yet

    receiver.start()
    later = Sender(clock=lambda: time.time() + 11)  # the clock seam: past the backoff
    assert later.send_due() == (1, 0)
    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("sent", 2, "")
    assert later.send_due() == (0, 0) and len(receiver.received) == 1


def test_errors_are_retried_with_growing_waits_until_the_window_ends(receiver, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "WEBHOOK_RETRY_FOR_S": 100,
                              "WEBHOOK_BACKOFF_BASE_S": 10, "WEBHOOK_BACKOFF_MAX_S": 40}
    receiver.status = 503
    alert_with_deliveries(receiver.url, thresholds="100")
    now = [time.time()]
    sender = Sender(clock=lambda: now[0], rng=lambda: 1.0)  # no jitter: the upper bound
    waits = []
    for _ in range(6):
        assert sender.send_due() == (0, 1)
        delivery = WebhookDelivery.objects.get()
        if delivery.status == "failed":
            break
        waits.append(round(delivery.next_attempt_at.timestamp() - now[0]))
        now[0] = delivery.next_attempt_at.timestamp()
    # doubled, capped at 40; after the 4th attempt (at 70 s) the next (110 s) would be past
    # the 100 s window: failed
    assert waits == [10, 20, 40]
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("failed", 4, 503)
    assert delivery.last_error == "HTTP 503 Service Unavailable"
    assert len(receiver.received) == 4
    assert sender.send_due() == (0, 0)  # failed for good


def test_backoff_jitter_stays_within_half_to_all_of_the_wait():
    config = {"WEBHOOK_BACKOFF_BASE_S": 10, "WEBHOOK_BACKOFF_MAX_S": 3600}
    assert backoff_s(1, config, rng=lambda: 0.0) == 5
    assert backoff_s(3, config, rng=lambda: 0.999999) == pytest.approx(40, abs=0.001)
    assert backoff_s(30, config, rng=lambda: 1.0) == 3600


def test_a_claimed_delivery_is_not_taken_by_another_sender_until_its_claim_lapses(receiver):
    alert_with_deliveries(receiver.url)
    first = Sender()
    assert len(first.claim()) == 2
    assert Sender().claim() == []  # claimed (status "sending"): another sender skips them
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"sending"}
    # the first sender died mid-send: after its claim lapses, another takes the rows again
    lapse_s = 5.0 + CLAIM_MARGIN_S + 1
    rescuer = Sender(clock=lambda: time.time() + lapse_s)
    assert rescuer.send_due() == (2, 0) and len(receiver.received) == 2


def hold_row_locks(pks, locked, release):
    """In this thread's own connection: lock the rows ``pks`` as a sender's claim does, until
    ``release`` is set (or 10 s)."""
    from django.db import connection, transaction

    try:
        with transaction.atomic():
            list(WebhookDelivery.objects.select_for_update().filter(pk__in=pks))
            locked.set()
            release.wait(10)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)  # committed rows: the other connection sees them
def test_rows_another_sender_is_claiming_are_skipped_not_waited_for(receiver):
    from django.db import connection

    if not connection.features.has_select_for_update_skip_locked:
        pytest.skip(f"{connection.vendor} has no row locks to skip (the conditional update alone "
                    f"keeps senders apart there)")
    from ratelimit_app.business.alerts.webhooks import first_attempt_times

    endpoint = WebhookEndpoint.objects.create(name="receiver", url=receiver.url)
    next_at, give_up_at = first_attempt_times()
    pks = [WebhookDelivery.objects.create(endpoint=endpoint, event="e", body="{}",
                                          next_attempt_at=next_at, give_up_at=give_up_at).pk
           for _ in range(4)]
    locked, release = threading.Event(), threading.Event()
    other = threading.Thread(target=hold_row_locks, args=(pks[:2], locked, release))
    other.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        claimed = [delivery.pk for delivery in Sender().claim()]
        waited_s = time.monotonic() - started
    finally:
        release.set()
        other.join(10)
    assert sorted(claimed) == pks[2:]  # the locked rows skipped...
    assert waited_s < 5  # ...not waited for (the other claim holds its locks until released)
    assert sorted(d.pk for d in Sender().claim()) == pks[:2]  # free again: taken now


def test_a_receiver_that_does_not_answer_times_out(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "WEBHOOK_TIMEOUT_S": 0.3}
    answer = threading.Event()
    import http.server

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            answer.wait(10)  # holds the request until the test is done

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        alert_with_deliveries(f"http://127.0.0.1:{server.server_address[1]}/", thresholds="100")
        started = time.monotonic()
        assert Sender().send_due() == (0, 1)
        assert time.monotonic() - started < 3
        assert "timed out" in WebhookDelivery.objects.get().last_error
    finally:
        answer.set()
        server.shutdown()
        server.server_close()


def test_a_redirect_is_not_followed(receiver):
    import http.server

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(302)
            self.send_header("Location", receiver.url)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        alert_with_deliveries(f"http://127.0.0.1:{server.server_address[1]}/", thresholds="100")
        assert Sender().send_due() == (0, 1)
        assert receiver.received == []
        assert WebhookDelivery.objects.get().last_status_code == 302
    finally:
        server.shutdown()
        server.server_close()


def test_resend_queues_sent_and_failed_deliveries_again(receiver):
    alert_with_deliveries(receiver.url, thresholds="100")
    assert Sender().send_due() == (1, 0)
    WebhookDelivery.objects.update(status=DeliveryStatus.FAILED)
    assert resend(WebhookDelivery.objects.all()) == 1
    delivery = WebhookDelivery.objects.get()
    assert delivery.status == "pending"
    assert delivery.give_up_at > datetime.datetime.now(datetime.timezone.utc) + \
        datetime.timedelta(hours=23)
    assert Sender().send_due() == (1, 0) and len(receiver.received) == 2
    assert QuotaAlert.objects.count() == 1  # the same alert, sent again
