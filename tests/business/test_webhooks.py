"""Webhook deliveries (business/alerts/webhooks.py, ``manage.py ratelimit deliver``) against a real
HTTP receiver started by the test: bodies signed by Standard Webhooks and verified with the
``standardwebhooks`` package, retries with backoff while the receiver is down, failure after the
retry window, claims that keep two senders apart, a timeout for a receiver that does not answer,
and the admin's re-send. Slow receivers and refused addresses: test_webhook_transport.py."""

import base64
import datetime
import io
import json
import threading
import time

import pytest
from django.core.management import call_command
from django.test import Client
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from ratelimit_app.business.alerts.models import (
    DeliveryStatus,
    QuotaAlert,
    WebhookDelivery,
    WebhookEndpoint,
)
from ratelimit_app.business.alerts.signing import legacy_signature_header, standard_headers
from ratelimit_app.business.alerts.webhooks import (
    CLAIM_MARGIN_S,
    Sender,
    backoff_s,
    resend,
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


def verified(secret, got):
    """The receiver's check, with the standardwebhooks package: returns the body's JSON."""
    return Webhook(secret).verify(got.body, got.headers)


def docs_verify():
    """The receiver's ``verify`` function from docs/howto/receive-webhooks.md, run as printed."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "receive-webhooks.md") \
        .read_text()
    code = next(block for block in text.split("```python")[1:] if "def verify(" in block)
    namespace = {}
    exec(code.split("```")[0], namespace)  # noqa: S102  (our own docs)
    return namespace["verify"]


def test_a_delivery_verifies_with_the_standardwebhooks_package_and_a_replay_does_not(receiver):
    endpoint = alert_with_deliveries(receiver.url, thresholds="100")
    assert Sender().send_due() == (1, 0)
    [got] = receiver.received
    assert endpoint.secret.startswith("whsec_")
    assert verified(endpoint.secret, got)["data"]["threshold_percent"] == 100
    assert got.headers["webhook-id"] == str(WebhookDelivery.objects.get().pk)
    assert got.headers["webhook-signature"].startswith("v1,")
    assert "X-Ratelimit-Signature" not in got.headers  # a new endpoint: the standard alone
    # the same signed body and signature replayed under new delivery ids: refused
    for new_id in ("2", "3", f"{got.headers['webhook-id']}0"):
        with pytest.raises(WebhookVerificationError):
            verified(endpoint.secret, type(got)(got.path, {**got.headers, "webhook-id": new_id},
                                                got.body))
    with pytest.raises(WebhookVerificationError):  # another body
        verified(endpoint.secret, type(got)(got.path, got.headers, got.body + b" "))


def test_the_docs_receiver_snippet_accepts_a_real_delivery_and_rejects_forgeries(receiver):
    endpoint = alert_with_deliveries(receiver.url, thresholds="100")
    assert Sender().send_due() == (1, 0)
    [got] = receiver.received
    verify = docs_verify()
    assert verify(endpoint.secret, got.headers, got.body)["type"] == "quota.exhausted"
    assert verify(endpoint.secret, got.headers, got.body.replace(b"100", b"101")) is None
    assert verify("whsec_" + "A" * 43, got.headers, got.body) is None  # another secret
    stale = standard_headers(endpoint.secret, got.headers["webhook-id"], time.time() - 3600,
                             got.body)
    assert verify(endpoint.secret, stale, got.body) is None  # a replay an hour later
    # headers a client can send that make the package raise ValueError: "invalid", not a 500
    for signature in ("v1,é", "v1,abc", "no comma", "v1,\u00ff\u00fe"):
        assert verify(endpoint.secret, {**got.headers, "webhook-signature": signature},
                      got.body) is None


def test_the_apps_own_check_verifies_both_schemes_and_refuses_replays_and_bad_bytes():
    secret = "whsec_" + "QUJD" * 8
    body = b'{"a":1}'
    headers = standard_headers(secret, "7", 1_000_000, body)
    assert verify_signature(secret, headers, body, now=1_000_100)
    assert not verify_signature(secret, {**headers, "webhook-id": "8"}, body, now=1_000_100)
    assert not verify_signature(secret, headers, b'{"a":2}', now=1_000_100)
    assert not verify_signature(secret, headers, body, now=1_000_000 + 301)  # too old
    assert not verify_signature(secret, {**headers, "webhook-signature": "v1,é"}, body,
                                now=1_000_100)
    assert not verify_signature("not base64 !", headers, body, now=1_000_100)
    # the former header (a string), checked with the former secret: the key is its text
    former = "whsec_former-secret_text"
    wrapped = "whsec_" + base64.b64encode(former.encode()).decode()
    legacy = legacy_signature_header(wrapped, 1_000_000, body)
    assert verify_signature(former, legacy, body, now=1_000_100)
    assert not verify_signature(former, legacy, b'{"a":2}', now=1_000_100)
    assert not verify_signature(former, legacy, body, now=1_000_000 + 301)
    assert not verify_signature(former, "t=1000000,v1=é", body, now=1_000_000)
    assert not verify_signature(former, "garbage", body, now=1_000_000)


def test_an_endpoint_made_before_the_standard_loses_no_delivery_across_the_migration(receiver):
    """An endpoint and a pending delivery as 0.1 made them (a secret of the former form), then
    migration 0019's step: the receiver, still checking the former header with the secret it
    was given, accepts the delivery; with the secret's wrapped form the standardwebhooks
    package verifies the same request."""
    import importlib
    from pathlib import Path

    from django.apps import apps

    import ratelimit_app.migrations

    # found by its name, whatever number the migration's chain gives it
    [name] = [path.stem for path in Path(ratelimit_app.migrations.__file__).parent.glob(
        "*_standard_webhooks.py")]
    migration = importlib.import_module(f"ratelimit_app.migrations.{name}")
    former = "whsec_" + "Zm9v-_bar" * 4  # token_urlsafe's alphabet: not standard base64
    endpoint = alert_with_deliveries(receiver.url, thresholds="100")
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret=former, signature_scheme="both")
    migration.wrap_secrets(apps, None)
    endpoint.refresh_from_db()
    assert endpoint.secret == "whsec_" + base64.b64encode(former.encode()).decode()

    assert Sender().send_due() == (1, 0)  # the delivery made before the migration
    [got] = receiver.received
    assert verify_signature(former, got.headers["X-Ratelimit-Signature"], got.body)
    assert got.headers["X-Ratelimit-Delivery"] == got.headers["webhook-id"]
    wrapped = "whsec_" + base64.b64encode(former.encode()).decode()  # what the docs tell
    assert verified(wrapped, got)["type"] == "quota.exhausted"

    migration.unwrap_secrets(apps, None)  # migrating back gives the former secret again
    assert WebhookEndpoint.objects.get().secret == former
    migration.wrap_secrets(apps, None)

    # the operator's switch, once the receiver checks the standard headers: those alone
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(signature_scheme="standard")
    WebhookDelivery.objects.update(status=DeliveryStatus.FAILED)
    resend(WebhookDelivery.objects.all())
    assert Sender().send_due() == (1, 0)
    assert "X-Ratelimit-Signature" not in receiver.received[1].headers
    assert verified(wrapped, receiver.received[1])


def test_deliver_once_sends_each_delivery_signed_then_nothing_more(receiver):
    endpoint = alert_with_deliveries(receiver.url)
    assert deliver_once() == "2 deliveries sent, 0 attempts failed (retried later).\n"
    assert len(receiver.received) == 2
    for got in receiver.received:
        assert verified(endpoint.secret, got)["type"] in ("quota.threshold_crossed",
                                                          "quota.exhausted")
        assert got.headers["Content-Type"] == "application/json"
        delivery = WebhookDelivery.objects.get(pk=got.headers["webhook-id"])
        assert got.body == delivery.body.encode()
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
    # one delivery per endpoint at a time: each sender takes one of the two
    assert len(Sender().claim(10)) == 1 and len(Sender().claim(10)) == 1
    assert Sender().claim(10) == []  # claimed (status "sending"): another sender skips them
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

    next_at, give_up_at = first_attempt_times()
    # four endpoints (a sender takes one delivery per endpoint at a time), one row each
    pks = [WebhookDelivery.objects.create(
        endpoint=WebhookEndpoint.objects.create(name=f"receiver {n}", url=receiver.url),
        event="e", body="{}", next_attempt_at=next_at, give_up_at=give_up_at).pk
        for n in range(4)]
    locked, release = threading.Event(), threading.Event()
    other = threading.Thread(target=hold_row_locks, args=(pks[:2], locked, release))
    other.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        claimed = [delivery.pk for delivery in Sender().claim(10)]
        waited_s = time.monotonic() - started
    finally:
        release.set()
        other.join(10)
    assert sorted(claimed) == pks[2:]  # the locked rows skipped...
    assert waited_s < 5  # ...not waited for (the other claim holds its locks until released)
    assert sorted(d.pk for d in Sender().claim(10)) == pks[:2]  # free again: taken now


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


def test_a_disabled_endpoint_receives_nothing_and_its_pending_deliveries_wait(receiver):
    endpoint = alert_with_deliveries(receiver.url, thresholds="100")
    receiver.stop()
    assert deliver_once().startswith("0 deliveries sent, 1 attempt failed")  # now pending
    receiver.start()
    endpoint.enabled = False
    endpoint.save()
    later = Sender(clock=lambda: time.time() + 3600)  # well past its next attempt
    assert later.send_due() == (0, 0)
    assert receiver.received == []
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("pending", 1)  # waiting, not failed
    endpoint.enabled = True
    endpoint.save()
    assert later.send_due() == (1, 0)
    assert len(receiver.received) == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("sent", 2)


def test_replacing_a_secret_in_the_admin_signs_by_the_standard_alone(receiver, admin_client):
    endpoint = WebhookEndpoint.objects.create(name="former", url=receiver.url,
                                              signature_scheme="both")
    page = admin_client.post("/admin/ratelimit_alerts/webhookendpoint/", {
        "action": "rotate_secret", "_selected_action": [endpoint.pk]})
    endpoint.refresh_from_db()
    assert endpoint.secret in page.content.decode() and "no-store" in page["Cache-Control"]
    assert endpoint.signature_scheme == "standard"


def test_no_secret_reaches_the_log_or_the_delivery_row(receiver, caplog):
    receiver.status = 500
    endpoint = alert_with_deliveries(receiver.url, thresholds="100")
    with caplog.at_level("DEBUG", logger="ratelimit_app"):
        assert Sender().send_due() == (0, 1)
    assert "failed (attempt 1): HTTP 500" in caplog.text
    delivery = WebhookDelivery.objects.get()
    for secret_text in (endpoint.secret, endpoint.secret.removeprefix("whsec_")):
        assert secret_text not in caplog.text
        assert secret_text not in delivery.last_error + delivery.body
