"""The demo's webhook receiver (project/demo/receiver.py): it accepts what the standardwebhooks
package verifies, refuses and keeps the rest (a malformed signature included: never a 500), stores
a delivery once, is never limited, and receives what the app's own sender sends."""

import io
import json
import time

import pytest
from django.core.management import call_command
from django.test import Client

from project.demo import receiver
from project.demo.models import ReceivedWebhook
from ratelimit_app.business.alerts.crossings import Crossing, store_crossings
from ratelimit_app.business.alerts.signing import standard_headers
from ratelimit_app.models import Rule, WebhookDelivery, WebhookEndpoint, new_webhook_secret
from tests.helpers import load_demo_data

RECEIVER = "/demo/webhooks/"
BODY = json.dumps({"type": "quota.threshold_crossed", "id": "alert_7",
                   "data": {"rule": "studio-daily", "threshold_percent": 80,
                            "identity": "key:4 (key rk_dana_…)"}}).encode()


@pytest.fixture
def secret(db):
    load_demo_data()
    return WebhookEndpoint.objects.get(name="demo receiver").secret


def signed(secret, body, timestamp=None, delivery="1"):
    """The Standard Webhooks headers of ``body`` sent as ``delivery``."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    return standard_headers(secret, delivery, timestamp, body)


def post(body, headers=None, delivery="1"):
    headers = {**(headers or {}), "webhook-id": delivery}
    # CSRF enforced as for a browser: the sender has no token, so the view must be exempt
    return Client(enforce_csrf_checks=True).post(RECEIVER, body, content_type="application/json",
                                                 headers=headers)


def test_a_delivery_signed_as_the_docs_say_is_stored_once(secret):
    assert post(BODY, signed(secret, BODY)).status_code == 200
    # the sender delivers at least once: the same delivery again is acknowledged, not stored
    assert post(BODY, signed(secret, BODY)).json()["duplicate"] is True
    row = ReceivedWebhook.objects.get()
    assert (row.delivery_id, row.signature_valid, row.times_received) == ("1", True, 2)
    assert row.body.encode() == BODY and row.event == "quota.threshold_crossed"
    assert row.alert()["threshold_percent"] == 80


@pytest.mark.parametrize("forge", [
    lambda secret: signed(new_webhook_secret(), BODY),               # another secret
    lambda secret: signed(secret, BODY.replace(b"80", b"10")),       # another body
    lambda secret: signed(secret, BODY, int(time.time()) - 301),     # replayed: too old
    lambda secret: {**signed(secret, BODY, delivery="9")},           # replayed: another id
    lambda secret: {**signed(secret, BODY), "webhook-signature": "v1,é"},  # not ASCII
    lambda secret: {**signed(secret, BODY), "webhook-signature": "v1"},    # no comma
    lambda secret: {**signed(secret, BODY), "webhook-timestamp": "soon"},  # not a time
], ids=["wrong secret", "tampered body", "stale", "another id", "non-ASCII", "no comma",
        "garbage time"])
def test_a_bad_signature_is_refused_and_kept_as_invalid(secret, forge):
    response = post(BODY, forge(secret))
    assert response.status_code == 401
    row = ReceivedWebhook.objects.get()
    assert row.signature_valid is False and row.body.encode() == BODY


def test_a_delivery_without_a_signature_is_a_bad_request(secret):
    assert post(BODY).status_code == 400
    assert ReceivedWebhook.objects.get().signature_valid is False
    # a verified delivery of the same id is still stored: the refusal proved nothing
    assert post(BODY, signed(secret, BODY)).status_code == 200
    assert ReceivedWebhook.objects.filter(signature_valid=True).count() == 1


def test_a_secret_replaced_in_the_admin_applies_at_once(secret):
    endpoint = WebhookEndpoint.objects.get(name="demo receiver")
    endpoint.secret = new_webhook_secret()
    endpoint.save()
    assert post(BODY, signed(secret, BODY), delivery="1").status_code == 401
    assert post(BODY, signed(endpoint.secret, BODY, delivery="2"),
                delivery="2").status_code == 200


def test_the_receiver_is_never_limited_and_charges_no_bucket(secret):
    # more posts than the anonymous free-ip bucket holds (40): none refused
    statuses = {post(BODY, signed(secret, BODY, delivery=str(i)), delivery=str(i)).status_code
                for i in range(45)}
    assert statuses == {200}
    hello = Client().get("/hello/")  # the same client IP, untouched by the 45 posts
    assert '"free-ip";r=39' in hello["RateLimit"]


def test_only_post_is_answered(secret):
    assert Client().get(RECEIVER).status_code == 405


def test_old_rows_go_first(secret, monkeypatch):
    monkeypatch.setattr(receiver, "KEEP_ROWS", 3)
    for delivery in "12345":
        post(BODY, signed(secret, BODY, delivery=delivery), delivery=delivery)
    assert list(ReceivedWebhook.objects.values_list("delivery_id", flat=True)) == ["5", "4", "3"]


def test_the_page_of_what_was_received_is_for_staff_and_tells_valid_from_invalid(
        secret, admin_client):
    post(BODY, signed(secret, BODY), delivery="1")
    post(BODY, signed(secret, BODY), delivery="1")
    post(BODY, {**signed(secret, BODY, delivery="2"), "webhook-signature": "v1,AAAA"},
         delivery="2")
    page = "/admin/demo/receivedwebhook/"
    assert Client().get(page).status_code == 302  # to the admin's login
    html = admin_client.get(page).content.decode()
    assert html.count('alt="True"') == 1 and html.count('alt="False"') == 1
    assert "studio-daily 80 % · key:4 (key rk_dana_…)" in html
    assert "1 (×2)" in html  # the delivery received twice, stored once
    assert admin_client.get(page + "add/").status_code == 403  # a record, not edited here


@pytest.mark.django_db(transaction=True)
def test_what_the_apps_sender_delivers_is_received_and_verified(live_server, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    call_command("load_demo", server_url=live_server.url, stdout=io.StringIO())
    rule = Rule.objects.get(name="studio-daily")
    store_crossings([Crossing(rule.id, "rl:{key.x}", "key:4 (key rk_dana_…)", 100,
                              1_700_000_000_000, 500, 500)])
    call_command("ratelimit", "deliver", "--once", stdout=io.StringIO())
    delivery = WebhookDelivery.objects.get()
    assert delivery.status == "sent" and delivery.last_status_code == 200
    row = ReceivedWebhook.objects.get()
    assert row.signature_valid and row.delivery_id == str(delivery.pk)
    assert row.body == delivery.body and row.event == "quota.exhausted"
