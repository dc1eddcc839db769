"""``load_demo``: rows the admin would accept, loaded again without duplicates, a launch week
that is on when the demo starts, and a webhook endpoint at the demo server's receiver."""

import datetime
import io
import re
import time

import pytest
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import timezone

from ratelimit_app.models import (
    ApiKey,
    EndpointCost,
    IdentityOverride,
    Plan,
    PlanAssignment,
    Rule,
    WebhookEndpoint,
)
from tests.helpers import use_fake_clock

pytestmark = pytest.mark.django_db
MODELS = [Plan, Rule, EndpointCost, PlanAssignment, ApiKey, IdentityOverride, WebhookEndpoint]


@override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
def load(**options):
    out = io.StringIO()
    call_command("load_demo", stdout=out, **options)
    return out.getvalue()


def test_every_demo_row_passes_the_admins_checks():
    """E.g. the metered estimate of api:generate must fit every bucket it is charged in, or
    the free plan's callers could never start a stream."""
    load()
    for model in MODELS:
        for row in model.objects.all():
            row.full_clean()


def test_loading_again_adds_nothing_and_starts_the_launch_week_afresh():
    load(server_url="http://127.0.0.1:8123")
    counts = {model: model.objects.count() for model in MODELS}
    first = IdentityOverride.objects.get(reason="launch week")
    endpoint = WebhookEndpoint.objects.get()
    out = load(server_url="http://127.0.0.1:8124/")
    assert {model: model.objects.count() for model in MODELS} == counts
    again = IdentityOverride.objects.get(reason="launch week")
    assert again.starts_at >= first.starts_at
    assert again.ends_at - again.starts_at == datetime.timedelta(days=7)
    assert again.schedule_at(timezone.now()) == "active"
    # the receiver's URL follows the server; the secret it verifies with stays
    assert WebhookEndpoint.objects.get().url == "http://127.0.0.1:8124/demo/webhooks/"
    assert WebhookEndpoint.objects.get().secret == endpoint.secret
    assert "http://127.0.0.1:8124/admin/demo/receivedwebhook/" in out
    assert "X-Api-Key: rk_dana_studio" in out


def policy(response, name):
    """Return the RateLimit-Policy item of ``name`` (its parameters as a string)."""
    return re.search(rf'"{name}";([^,]*)', response["RateLimit-Policy"]).group(1)


def test_the_launch_week_gives_dana_twice_the_words_per_minute_for_seven_days():
    load()
    clock = use_fake_clock(now_ms=int(time.time() * 1000))  # the week has begun
    dana = {"X-Api-Key": "rk_dana_studio"}
    assert policy(Client().get("/api/items/", headers=dana), "studio-minute") == "q=1200;w=30"
    clock.advance((7 * 86400 + 1) * 1000)
    # the rule's own numbers again: 1200 per 60 s, burst 600
    assert policy(Client().get("/api/items/", headers=dana), "studio-minute") == "q=600;w=30"
