"""D3: failed authentication is charged to the client IP, so password and key guessing is limited.

The demo's DRF API authenticates with Basic credentials (DRF raises before any throttle runs on
a wrong password), plain views and the admin log in through Django's ``authenticate()``, and API
keys are the limiter's own. All three kinds of failure cost the client IP one token of the
failed-auth rule; once it is empty, every request from that IP is refused, whatever it sends.
"""

import base64
import json

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.test import Client, override_settings
from django.urls import include, path
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.models import Counts, Plan, Rule, Scope

from ..helpers import limiter, load_demo_data, use_fake_clock

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.runtime.test_failed_auth")]


class BearerAuthentication(BaseAuthentication):
    """A token scheme that never calls Django's authenticate(): every token here is unknown."""

    def authenticate(self, request):
        if request.META.get("HTTP_AUTHORIZATION", "").startswith("Bearer "):
            raise AuthenticationFailed("Invalid token.")
        return None

    def authenticate_header(self, request):
        return "Bearer"  # makes DRF answer 401


class TokenOnlyView(APIView):
    authentication_classes = [BearerAuthentication]

    def get(self, request):
        return Response({"ok": True})


class SessionThenTokenView(TokenOnlyView):
    # DRF answers 403, not 401, when the first scheme sends no WWW-Authenticate
    authentication_classes = [SessionAuthentication, BearerAuthentication]

urlpatterns = [
    path("", include("project.urls")),
    path("token-only/", TokenOnlyView.as_view(), name="token-only"),
    path("session-then-token/", SessionThenTokenView.as_view(), name="session-then-token"),
]

BURST = 3
FAST_HASHER = override_settings(
    PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])


@pytest.fixture
def demo(monkeypatch):
    with FAST_HASHER:
        load_demo_data()
        Rule.objects.filter(counts=Counts.FAILED_AUTH).delete()
        Rule.objects.create(name="auth-failures", scope=Scope.IP, counts=Counts.FAILED_AUTH,
                            rate=1, period_s=60, burst=BURST)
        limiter().policies.reset()
        use_fake_clock(monkeypatch)  # no refill during a test
        yield


def basic(username, password):
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"HTTP_AUTHORIZATION": f"Basic {token}"}


def problem(response):
    assert response.status_code == 429
    return json.loads(response.content)


def test_wrong_passwords_to_a_drf_endpoint_are_limited(demo):
    client = Client()
    for _ in range(BURST):
        assert client.get("/api/items/", **basic("alice", "wrong")).status_code == 403
    refused = client.get("/api/items/", **basic("alice", "wrong"))
    assert "auth-failures" in problem(refused)["violated-policies"]
    assert "Retry-After" in refused
    # the right password now gets the same answer: a blocked client learns nothing by guessing
    right = client.get("/api/items/", **basic("alice", "demo-pass"))
    assert problem(right)["violated-policies"] == ["auth-failures"]
    assert "free-user" not in right["RateLimit-Policy"]  # the plan of the account stays hidden
    # another address is not affected
    assert Client(REMOTE_ADDR="198.51.100.9").get(
        "/api/items/", **basic("alice", "demo-pass")).status_code == 200


@pytest.mark.parametrize("path, status", [("/token-only/", 401), ("/session-then-token/", 403)])
def test_unknown_tokens_are_limited_without_django_authenticate(demo, path, status):
    client = Client()
    for _ in range(BURST):
        assert client.get(path, HTTP_AUTHORIZATION="Bearer guess").status_code == status
    assert "auth-failures" in problem(
        client.get(path, HTTP_AUTHORIZATION="Bearer guess"))["violated-policies"]


def test_requests_without_credentials_are_not_failures(demo):
    client = Client()
    for _ in range(BURST + 2):  # DRF's NotAuthenticated is no guess
        assert client.get("/token-only/").status_code == 200


def test_successful_requests_never_spend_the_failed_auth_bucket(demo):
    client = Client()
    for _ in range(10):
        response = client.get("/api/items/", **basic("alice", "demo-pass"))
        assert response.status_code == 200
        assert "auth-failures" not in response["RateLimit-Policy"]  # shown only when refusing
    for _ in range(BURST):
        assert client.get("/api/items/", **basic("alice", "wrong")).status_code == 403


def test_unknown_api_keys_are_charged_as_failed_authentication(demo):
    client = Client()
    for i in range(BURST):
        response = client.get("/api/items/", HTTP_X_API_KEY=f"rk_guess_{i}")
        assert response.status_code == 200  # served as an anonymous caller...
        assert response.wsgi_request.ratelimit.identity.kind == "anonymous"
    # ...but each guess counted: the next one, and a right key from the same IP, are refused
    assert "auth-failures" in problem(
        client.get("/api/items/", HTTP_X_API_KEY="rk_guess_x"))["violated-policies"]
    right = client.get("/hello/", HTTP_X_API_KEY="rk_alice_free")
    wrong = client.get("/hello/", HTTP_X_API_KEY="rk_guess_y")
    assert problem(right)["violated-policies"] == ["auth-failures"]
    # byte for byte the same answer: even the jitter of Retry-After is the address's
    for header in ("Retry-After", "RateLimit-Policy", "RateLimit"):
        assert right[header] == wrong[header]
    assert right.content == wrong.content


def test_a_known_api_key_is_not_charged(demo):
    client = Client()
    for _ in range(BURST + 2):
        assert client.get("/api/items/", HTTP_X_API_KEY="rk_alice_free").status_code == 200


def test_failed_admin_logins_are_limited_and_a_right_password_then_refused(demo):
    client = Client()
    for _ in range(BURST):
        response = client.post("/admin/login/", {"username": "admin", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    assert problem(client.post("/admin/login/", {"username": "admin", "password": "wrong"}))
    # the right password, once blocked: refused before the form checks it; no session begins
    response = client.post("/admin/login/", {"username": "admin", "password": "admin"})
    assert problem(response)["violated-policies"] == ["auth-failures"]
    assert "sessionid" not in response.cookies
    # pages that are not form posts stay reachable (the admin is exempt from quotas)
    assert client.get("/admin/login/").status_code == 200


def test_without_failed_auth_rules_failures_cost_nothing(demo, redis_server):
    Rule.objects.filter(counts=Counts.FAILED_AUTH).delete()
    limiter().policies.reset()
    client = Client()
    calls = redis_server.command_calls("evalsha")
    for _ in range(BURST + 2):
        assert client.get("/api/items/", **basic("alice", "wrong")).status_code == 403
    assert redis_server.command_calls("evalsha") == calls  # not one Redis call for them


def test_failed_auth_rules_must_be_per_ip_and_for_every_plan(db):
    plan = Plan.objects.create(slug="free", name="Free")
    rule = Rule(name="x", scope=Scope.USER, counts=Counts.FAILED_AUTH, rate=1, period_s=60,
                burst=5)
    with pytest.raises(ValidationError) as error:
        rule.full_clean()
    assert "scope" in error.value.message_dict
    rule.scope, rule.plan = Scope.IP, plan
    with pytest.raises(ValidationError) as error:
        rule.full_clean()
    assert "plan" in error.value.message_dict
    rule.plan = None
    rule.full_clean()


def test_an_inactive_user_or_unknown_user_counts_as_a_failure(demo):
    get_user_model().objects.filter(username="bob").update(is_active=False)
    client = Client()
    for username in ("bob", "nobody", "alice"):
        client.get("/api/items/", **basic(username, "demo-pass" if username == "bob" else "x"))
    assert problem(client.get("/api/items/", **basic("carol", "x")))


# --- callers sharing an address (issue 50: a NAT, or a proxy missing from TRUSTED_PROXIES) ----

def test_a_key_used_from_the_address_is_not_locked_out_by_others_guessing(demo):
    bob, guesser = Client(), Client()  # one address: 127.0.0.1
    assert bob.get("/hello/", HTTP_X_API_KEY="rk_bob_pro").status_code == 200  # proven here
    for i in range(11):  # another client behind the same NAT, with a stale key
        guesser.get("/hello/", HTTP_X_API_KEY=f"rk_stale_{i}")
    # the guesser is stopped...
    assert problem(guesser.get("/hello/", HTTP_X_API_KEY="rk_stale_x"))["violated-policies"] \
        == ["auth-failures"]
    # ...and bob's valid key, used from this address before, still gets through
    response = bob.get("/hello/", HTTP_X_API_KEY="rk_bob_pro")
    assert response.status_code == 200
    assert "auth-failures" not in response["RateLimit-Policy"]


def test_a_right_guess_of_a_credential_never_used_from_the_address_stays_locked(demo):
    client = Client()
    for i in range(BURST):
        client.get("/hello/", HTTP_X_API_KEY=f"rk_guess_{i}")
    right = client.get("/hello/", HTTP_X_API_KEY="rk_alice_free")  # valid, but unproven here
    wrong = client.get("/hello/", HTTP_X_API_KEY="rk_guess_z")
    assert problem(right)["violated-policies"] == ["auth-failures"]
    assert right.content == wrong.content and right["Retry-After"] == wrong["Retry-After"]


def test_a_proof_is_per_address_and_lapses_after_its_memory(demo, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "FAILED_AUTH_PROOF_S": 600}
    clock = use_fake_clock()
    limiter().policies.reset()
    here, elsewhere = Client(), Client(REMOTE_ADDR="198.51.100.7")
    assert elsewhere.get("/hello/", HTTP_X_API_KEY="rk_bob_pro").status_code == 200
    for i in range(BURST):
        here.get("/hello/", HTTP_X_API_KEY=f"rk_guess_{i}")
    # proven from another address only: locked out here
    assert problem(here.get("/hello/", HTTP_X_API_KEY="rk_bob_pro"))
    # proven here, then the memory passes without a use (the gate stays empty: no refill
    # beyond one token in 60 s, and the guesser keeps failing)
    clock.advance(60_000)
    assert here.get("/hello/", HTTP_X_API_KEY="rk_bob_pro").status_code == 200  # a token back
    here.get("/hello/", HTTP_X_API_KEY="rk_guess_again")
    assert here.get("/hello/", HTTP_X_API_KEY="rk_bob_pro").status_code == 200  # proven
    clock.advance(601_000)
    for i in range(BURST):
        here.get("/hello/", HTTP_X_API_KEY=f"rk_guess_late_{i}")
    assert problem(here.get("/hello/", HTTP_X_API_KEY="rk_bob_pro"))  # the proof lapsed


def test_proofs_off_restore_the_address_wide_lock(demo, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "FAILED_AUTH_PROOF_S": 0}
    use_fake_clock()
    limiter().policies.reset()
    client = Client()
    assert client.get("/hello/", HTTP_X_API_KEY="rk_bob_pro").status_code == 200
    for i in range(BURST):
        client.get("/hello/", HTTP_X_API_KEY=f"rk_guess_{i}")
    assert problem(client.get("/hello/", HTTP_X_API_KEY="rk_bob_pro"))
