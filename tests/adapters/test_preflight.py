"""CORS preflights (issue 9, D14): browsers report a refused preflight as a CORS failure, so
neither adapter charges or refuses one unless CHARGE_PREFLIGHT is set."""

import pytest
from django.test import Client

from ratelimit_app.models import Plan, Rule, Scope

from ..helpers import use_fake_clock

pytestmark = pytest.mark.django_db

PREFLIGHT = {"HTTP_ORIGIN": "https://app.example", "HTTP_ACCESS_CONTROL_REQUEST_METHOD": "GET"}
# /hello/ is limited by the middleware, /api/items/ by QuotaThrottle
PATHS = ["/hello/", "/api/items/"]


@pytest.fixture
def two_per_minute(monkeypatch):
    plan = Plan.objects.create(slug="tight", name="Tight", default_for_anonymous=True)
    Rule.objects.create(name="ip-minute", plan=plan, scope=Scope.IP, rate=2, period_s=60, burst=2)
    return use_fake_clock(monkeypatch)


def bucket_keys(redis_client):
    return list(redis_client.scan_iter("rl:{*"))


@pytest.mark.parametrize("path", PATHS)
def test_preflight_is_neither_charged_nor_refused(two_per_minute, redis_client, path):
    client = Client()
    responses = [client.options(path, **PREFLIGHT) for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert all("RateLimit" not in r and "Retry-After" not in r for r in responses)
    assert bucket_keys(redis_client) == []  # no bucket touched
    # the real request after it still has the whole burst
    assert client.get(path)["RateLimit"] == '"ip-minute";r=1;t=30'


@pytest.mark.parametrize("path", PATHS)
def test_an_options_request_that_is_no_preflight_is_charged(two_per_minute, path):
    client = Client()
    without_method = {"HTTP_ORIGIN": "https://app.example"}
    without_origin = {"HTTP_ACCESS_CONTROL_REQUEST_METHOD": "GET"}
    statuses = [client.options(path, **without_method).status_code,
                client.options(path, **without_origin).status_code,
                client.options(path).status_code]
    assert statuses == [200, 200, 429]


@pytest.mark.parametrize("path", PATHS)
def test_charge_preflight_setting_charges_and_refuses_them(settings, two_per_minute, path):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CHARGE_PREFLIGHT": True}
    client = Client()
    assert [client.options(path, **PREFLIGHT).status_code for _ in range(3)] == [200, 200, 429]
