"""QuotaThrottle as a true DRF drop-in (issue 9, D10): a refusal is DRF's ``Throttled`` path, so
the project's EXCEPTION_HANDLER sees it, ``response.data`` holds the problem fields, DRF's
renderers and content negotiation apply, and the rate-limit headers are still set."""

import json

import pytest
from django.test import Client
from rest_framework.exceptions import Throttled
from rest_framework.views import exception_handler

from ratelimit_app.decision.headers import QUOTA_EXCEEDED
from ratelimit_app.models import Plan, Rule, Scope
from ratelimit_app.throttling import QuotaThrottled

from ..helpers import use_fake_clock

pytestmark = pytest.mark.django_db

MIDDLEWARE_PATH = "ratelimit_app.middleware.QuotaMiddleware"
PROBLEM_FIELDS = {"type", "title", "status", "detail", "violated-policies", "retry-after"}

seen_by_handler = []


def recording_handler(exc, context):
    """A project's exception handler: records what it is given (read the way common handlers
    read it), then does DRF's default."""
    seen_by_handler.append((exc, exc.get_codes(), exc.get_full_details()))
    response = exception_handler(exc, context)
    response["X-Handled-By"] = "project"
    return response


@pytest.fixture
def one_per_minute(monkeypatch):
    """Anonymous callers: one request per 60 s per IP; the clock stands still."""
    seen_by_handler.clear()
    plan = Plan.objects.create(slug="tight", name="Tight", default_for_anonymous=True)
    Rule.objects.create(name="ip-minute", plan=plan, scope=Scope.IP, rate=1, period_s=60, burst=1)
    return use_fake_clock(monkeypatch)


@pytest.fixture(params=["with middleware", "throttle only"])
def adapters(request, settings):
    if request.param == "throttle only":
        settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE_PATH]
    return request.param


@pytest.fixture
def project_handler(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "EXCEPTION_HANDLER":
                               "tests.adapters.test_drf_dropin.recording_handler"}


def refused(accept="application/json"):
    client = Client()
    assert client.get("/api/items/", HTTP_ACCEPT=accept).status_code == 200
    return client.get("/api/items/", HTTP_ACCEPT=accept)


def test_project_exception_handler_sees_the_throttled_exception(one_per_minute, adapters,
                                                                 project_handler):
    response = refused()
    assert response.status_code == 429
    assert response["X-Handled-By"] == "project"  # the project's handler built this response
    [(exc, codes, details)] = seen_by_handler
    assert isinstance(exc, Throttled) and isinstance(exc, QuotaThrottled)
    assert exc.decision is response.wsgi_request.ratelimit
    assert exc.wait == int(response["Retry-After"])
    assert codes == "throttled"
    assert details == {"message": response.data["detail"], "code": "throttled"}


def test_response_data_holds_the_problem_fields_and_headers_are_set(one_per_minute, adapters):
    response = refused()
    assert response.status_code == 429
    assert set(response.data) == PROBLEM_FIELDS
    assert response.data["type"] == QUOTA_EXCEEDED
    assert response.data["status"] == 429  # a number, not DRF's ErrorDetail string
    assert response.data["violated-policies"] == ["ip-minute"]
    assert response.data["retry-after"] == int(response["Retry-After"]) >= 60
    assert response["RateLimit-Policy"] == '"ip-minute";q=1;w=60'
    assert response["RateLimit"] == '"ip-minute";r=0;t=60'


def test_accept_json_gets_a_json_429(one_per_minute, adapters):
    response = refused("application/json")
    assert response.status_code == 429
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content) == response.data


def test_browsable_api_still_renders_a_429_page(one_per_minute, adapters):
    response = refused("text/html")
    assert response.status_code == 429
    assert response["Content-Type"].startswith("text/html")
    assert b"Quota exceeded" in response.content and b"ip-minute" in response.content
    assert "Retry-After" in response and "RateLimit" in response


def test_accept_only_problem_json_gets_429_not_406(one_per_minute):
    # DRF's content negotiation fails before throttles run; the middleware decides instead
    client = Client()
    first = client.get("/api/items/", HTTP_ACCEPT="application/problem+json")
    assert first.status_code == 406  # DRF cannot render items as problem+json ...
    assert first["RateLimit"] == '"ip-minute";r=0;t=60'  # ... but it was charged
    response = client.get("/api/items/", HTTP_ACCEPT="application/problem+json")
    assert response.status_code == 429
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["type"] == QUOTA_EXCEEDED and body["violated-policies"] == ["ip-minute"]
    assert int(response["Retry-After"]) == body["retry-after"] >= 60

