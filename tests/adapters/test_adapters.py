"""The two thin adapters, QuotaMiddleware and QuotaThrottle, around the real engine: who decides
which views, with which user, at which cost, and that neither ever turns a limiter failure into
a 500. (Headers and the 429 body are tested in test_headers.py.)"""

import base64
import io
import json

import pytest
from django.core.management import call_command
from django.test import Client
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from ratelimit_app.conf import ExemptPaths
from ratelimit_app.runtime import guard
from ratelimit_app.throttling import QuotaThrottle

from ..helpers import limiter, use_fake_clock

pytestmark = pytest.mark.django_db

ALICE_KEY = "rk_alice_free"


@pytest.fixture
def demo(settings, monkeypatch):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins
    call_command("load_demo", stdout=io.StringIO())
    return use_fake_clock(monkeypatch)  # no refill between requests: exact numbers


def decision_of(response):
    return getattr(response.wsgi_request, guard.DECISION_ATTR, None)


def basic_auth(username, password="demo-pass"):
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"HTTP_AUTHORIZATION": f"Basic {token}"}


# --- who decides ---------------------------------------------------------------------------------

def test_throttle_decides_drf_views_after_drf_authentication(demo):
    # HTTP Basic is DRF authentication: only the throttle, running inside the view, sees the user
    response = Client().get("/api/items/", **basic_auth("bob"))
    assert response.status_code == 200
    identity = decision_of(response).identity
    assert (identity.kind, identity.display, identity.plan) == ("user", "bob", "pro")


def test_middleware_including_drf_decides_before_drf_authentication(demo, settings):
    # the documented trade-off of MIDDLEWARE_INCLUDES_DRF: DRF-only credentials are not seen yet
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "MIDDLEWARE_INCLUDES_DRF": True}
    response = Client().get("/api/items/", **basic_auth("bob"))
    assert response.status_code == 200
    assert decision_of(response).identity.kind == "anonymous"
    # API keys are read from the request itself, so they work at either point
    response = Client(HTTP_X_API_KEY=ALICE_KEY).get("/api/items/")
    assert decision_of(response).identity.kind == "key"


def test_middleware_decides_plain_views_with_the_session_user(demo):
    client = Client()
    client.login(username="carol", password="demo-pass")
    identity = decision_of(client.get("/hello/")).identity
    assert (identity.kind, identity.plan, identity.tenant) == ("user", "enterprise", "acme")


def test_middleware_denial_never_reaches_the_plain_view(demo):
    client = Client()
    statuses = [client.get("/hello/").status_code for _ in range(41)]  # free-ip: burst 40
    assert statuses == [200] * 40 + [429]
    denied = client.get("/hello/")
    assert json.loads(denied.content)["violated-policies"] == ["free-ip"]
    assert b"hello" not in denied.content


def test_exempt_paths_setting_is_honoured_and_costs_nothing(demo, settings, redis_server):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EXEMPT_PATHS": ["/hello/"]}
    calls = redis_server.command_calls("evalsha")
    response = Client().get("/hello/")
    assert response.status_code == 200 and decision_of(response) is None
    assert redis_server.command_calls("evalsha") == calls
    assert decision_of(Client().get("/api/items/")) is not None  # other paths still limited


@pytest.mark.parametrize("entry, exempt", [
    ("/hello", True),     # the path and what lies beneath it
    ("/hell", False),     # not a segment of /hello/ (as /health never exempts /healthcare/)
    ("/hell*", True),     # an entry ending in * keeps a plain string prefix
    ("/hello/", True),
    ("/hello/x", False),
])
def test_exempt_paths_match_whole_path_segments(demo, settings, redis_server, entry, exempt):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EXEMPT_PATHS": [entry]}
    calls = redis_server.command_calls("evalsha")
    response = Client().get("/hello/")
    assert response.status_code == 200
    assert (decision_of(response) is None) is exempt
    assert (redis_server.command_calls("evalsha") == calls) is exempt


def test_exempt_paths_entries_compile_to_segments_and_prefixes():
    exempt = ExemptPaths(["/health", "/admin/", "/legacy*"])
    assert [path for path in ("/health", "/health/", "/health/db", "/healthcare/", "/healthz",
                              "/admin", "/admin/", "/admin/x", "/legacy", "/legacy-api/v1",
                              "/other") if exempt.matches(path)] == \
        ["/health", "/health/", "/health/db", "/admin/", "/admin/x", "/legacy", "/legacy-api/v1"]
    assert exempt == ExemptPaths(["/health", "/admin/", "/legacy*"])
    assert hash(exempt) == hash(ExemptPaths(["/health", "/admin/", "/legacy*"]))


def test_unknown_urls_are_charged_on_the_rules_of_every_endpoint(demo):
    # (issue 50 §2: they used to go uncharged; tests/adapters/test_requests_without_view.py)
    response = Client().get("/no-such-page/")
    assert response.status_code == 404 and decision_of(response).endpoint == ""


# --- cost -----------------------------------------------------------------------------------------

def test_post_is_charged_its_endpoint_cost_and_denied_when_a_level_runs_short(demo):
    client = Client(HTTP_X_API_KEY=ALICE_KEY)
    first = client.post("/api/reports/")
    assert first.status_code == 202
    remaining = {p.name: p.remaining for p in decision_of(first).policies}
    assert remaining["free-user"] == 10 and remaining["free-reports"] == 4  # 30-20; 5-1
    second = client.post("/api/reports/")
    assert second.status_code == 429
    assert decision_of(second).violated == ("free-user",)
    # the denial debited nothing: a cheap request still sees 10 tokens
    third = client.get("/api/items/")
    assert {p.name: p.remaining for p in decision_of(third).policies}["free-user"] == 9


# --- the throttle on its own ----------------------------------------------------------------------

class ThrottledView(APIView):
    authentication_classes = ()
    permission_classes = ()
    throttle_classes = (QuotaThrottle,)

    def get(self, request):
        return Response({"ok": True})


def test_throttle_works_in_throttle_classes_without_the_middleware(demo, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": []}
    view = ThrottledView.as_view()
    factory = APIRequestFactory()
    statuses = []
    for _ in range(41):  # anonymous free plan: free-ip burst 40
        request = factory.get("/anything/", REMOTE_ADDR="198.51.100.20")
        statuses.append(view(request).status_code)
    assert statuses == [200] * 40 + [429]
    denied = view(factory.get("/anything/", REMOTE_ADDR="198.51.100.20"))
    assert int(denied["Retry-After"]) >= 1
    # DRF's response, with the problem fields and the headers QuotaThrottle set on the view
    assert denied.data["violated-policies"] == ["free-ip"]
    assert denied["RateLimit"] == '"free-ip";r=0;t=3'


def test_wait_is_none_before_any_decision():
    assert QuotaThrottle().wait() is None


# --- never a 500 ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/hello/", "/api/items/"])
def test_an_unexpected_limiter_error_lets_the_request_through(demo, monkeypatch, path, caplog):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in the limiter")

    monkeypatch.setattr(limiter(), "decide", broken)
    response = Client(raise_request_exception=True).get(path)
    assert response.status_code == 200
    assert decision_of(response).degraded == "error"
    assert "RateLimit" not in response
    assert any("unexpected ZeroDivisionError while deciding a request" in r.getMessage()
               for r in caplog.records)
    assert limiter().stats.unexpected_by_type == {"ZeroDivisionError": 1}


def test_decision_is_made_once_per_request(demo, monkeypatch, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "MIDDLEWARE_INCLUDES_DRF": True}
    calls = []
    real = limiter().decide

    def counting(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(limiter(), "decide", counting)
    Client().get("/api/search/")
    Client().get("/hello/")
    assert calls == ["api:search", "hello"]
