"""Redis down, hung, restarted or without its scripts, under the real middleware and throttle:
never a 500; fail-open or fail-closed as configured (per rule where set); the circuit breaker
stops paying for a dead Redis and closes by itself once Redis is back; NOSCRIPT is handled.

The suite's redis-server is really killed and restarted (on the same port); ``conftest`` starts
it again if a test leaves it down.
"""

import hashlib
import json
import time
from importlib import resources

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import Client, RequestFactory

from ratelimit_app.decision.headers import TEMPORARY_REDUCED_CAPACITY
from ratelimit_app.models import FailureMode, Mode, Plan, Rule, Scope

from ..helpers import decide, limiter

pytestmark = pytest.mark.django_db

COOLDOWN_S = 0.2
RECOVERY_DEADLINE_S = 5.0
T0 = 1_700_000_000_000
TAKE_SHA = hashlib.sha1(
    resources.files("ratelimit_app.stores").joinpath("lua/take.lua").read_bytes(),
    usedforsecurity=False).hexdigest()


@pytest.fixture
def limits(settings):
    """Settings for these tests: a short breaker cooldown and no version polling, so every
    Redis call a test sees is a decision's own."""

    def configure(**overrides):
        settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "BREAKER_FAILURES": 3,
                                  "BREAKER_COOLDOWN_S": COOLDOWN_S,
                                  "CONFIG_CHECK_INTERVAL_S": 3600, **overrides}

    configure()
    return configure


@pytest.fixture
def free_plan():
    return Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)


def add_rule(name, plan, scope=Scope.IP, endpoint="", burst=5, **fields):
    return Rule.objects.create(name=name, plan=plan, scope=scope, endpoint=endpoint, rate=1,
                               period_s=60, burst=burst, **fields)


def decision_of(response):
    return response.wsgi_request.ratelimit


def problem_of(response):
    """Return the problem fields of a 429: the middleware's problem+json body, or the data of
    DRF's response (rendered as JSON by DRF)."""
    assert response.status_code == 429
    if response["Content-Type"] == "application/json":
        assert json.loads(response.content) == response.data
        return response.data
    assert response["Content-Type"] == "application/problem+json"
    return json.loads(response.content)


def get_all(client, paths):
    """GET every path; return the responses (a 500 would raise in the test client)."""
    return [client.get(path) for path in paths]


# --- fail-open / fail-closed -------------------------------------------------------------------

def test_fail_open_by_default_lets_requests_through(limits, free_plan, redis_server):
    add_rule("free-ip", free_plan)
    client = Client()
    assert "RateLimit" in client.get("/hello/")  # warm: snapshot loaded while Redis is up
    redis_server.kill()
    for response in get_all(client, ["/hello/", "/api/items/"] * 5):
        assert response.status_code == 200
        assert decision_of(response).degraded == "fail-open"
        assert "RateLimit" not in response and "Retry-After" not in response


def test_fail_closed_setting_refuses_with_a_problem_body(limits, free_plan, redis_server):
    limits(FAIL_OPEN=False)
    add_rule("free-ip", free_plan)
    client = Client()
    assert client.get("/hello/").status_code == 200
    redis_server.kill()
    for response in get_all(client, ["/hello/", "/api/items/"]):  # plain view and DRF view
        problem = problem_of(response)
        # not the client's quota: the draft's problem type for reduced capacity
        assert problem["type"] == TEMPORARY_REDUCED_CAPACITY
        assert problem["status"] == 429
        assert problem["violated-policies"] == ["free-ip"]
        assert "cannot reach its store" in problem["detail"]
        assert response["Retry-After"] == "1"  # the breaker cooldown, at least one second
        assert problem["retry-after"] == 1
        assert decision_of(response).degraded == "fail-closed"


def test_rule_set_to_closed_overrides_an_open_default(limits, free_plan, redis_server):
    add_rule("free-ip", free_plan)
    add_rule("search-guard", free_plan, endpoint="api:search",
             on_redis_failure=FailureMode.CLOSED)
    client = Client()
    client.get("/api/items/")
    redis_server.kill()
    assert client.get("/api/items/").status_code == 200       # only default rules apply
    refused = client.get("/api/search/")
    assert problem_of(refused)["violated-policies"] == ["search-guard"]
    assert problem_of(refused)["type"] == TEMPORARY_REDUCED_CAPACITY
    assert int(refused["Retry-After"]) >= 1


def test_rule_set_to_open_overrides_a_closed_default(limits, free_plan, redis_server):
    limits(FAIL_OPEN=False)
    add_rule("free-ip", free_plan, on_redis_failure=FailureMode.OPEN)
    add_rule("search-default", free_plan, endpoint="api:search")
    client = Client()
    client.get("/api/items/")
    redis_server.kill()
    response = client.get("/api/items/")                       # only the open rule applies
    assert response.status_code == 200 and decision_of(response).degraded == "fail-open"
    assert problem_of(client.get("/api/search/"))["violated-policies"] == ["search-default"]


def test_shadow_rules_never_refuse_even_when_closed(limits, free_plan, redis_server):
    limits(FAIL_OPEN=False)
    add_rule("trial", free_plan, mode=Mode.SHADOW, on_redis_failure=FailureMode.CLOSED)
    client = Client()
    client.get("/hello/")
    redis_server.kill()
    assert client.get("/hello/").status_code == 200


def test_cold_start_with_redis_down_then_config_loads_once_it_is_back(limits, free_plan,
                                                                      redis_server):
    add_rule("free-ip", free_plan, burst=3)
    redis_server.kill()
    client = Client()
    response = client.get("/hello/")  # no snapshot yet and no Redis: rules still load from the DB
    assert response.status_code == 200 and decision_of(response).degraded == "fail-open"
    assert limiter().snapshot().version == "unknown"

    redis_server.start()
    limiter().breaker.record_success()  # skip the cooldown; recovery itself is tested below
    response = client.get("/hello/")
    assert decision_of(response).degraded == ""
    assert response["RateLimit"] == '"free-ip";r=2;t=60'
    assert limiter().snapshot().version == "0"  # the Lua reply's version replaced "unknown"


# --- a hung Redis ------------------------------------------------------------------------------

def test_a_hung_redis_costs_a_socket_timeout_not_a_500(limits, free_plan, redis_server,
                                                       redis_client):
    add_rule("free-ip", free_plan)
    client = Client()
    client.get("/hello/")
    redis_client.client_pause(3000, all=False)  # writes (our script) wait 3 s; UNPAUSE does not
    try:
        started = time.monotonic()
        response = client.get("/hello/")
        elapsed = time.monotonic() - started
    finally:
        redis_client.client_unpause()
    assert response.status_code == 200 and decision_of(response).degraded == "fail-open"
    assert elapsed < 2.0  # bounded by SOCKET_TIMEOUT (0.25 s), not by the 3 s pause
    assert "TimeoutError" in limiter().stats.last_error


# --- circuit breaker ---------------------------------------------------------------------------

def test_breaker_opens_after_the_configured_failures_and_skips_redis(limits, free_plan,
                                                                    redis_server):
    add_rule("free-ip", free_plan)
    client = Client()
    client.get("/hello/")
    redis_server.kill()
    errors, skips = limiter().stats.redis_errors, limiter().stats.breaker_skips

    responses = get_all(client, ["/hello/"] * 10)
    assert all(r.status_code == 200 for r in responses)
    assert limiter().stats.redis_errors - errors == 3     # BREAKER_FAILURES calls reached out
    assert limiter().stats.breaker_skips - skips == 7     # the rest never touched the network
    assert limiter().breaker.state == "open"
    assert limiter().breaker.times_opened == 1


def test_breaker_threshold_follows_the_setting(limits, free_plan, redis_server):
    limits(BREAKER_FAILURES=5)
    add_rule("free-ip", free_plan)
    client = Client()
    client.get("/hello/")
    redis_server.kill()
    errors = limiter().stats.redis_errors
    get_all(client, ["/hello/"] * 8)
    assert limiter().stats.redis_errors - errors == 5


def test_recovers_automatically_after_the_cooldown_once_redis_is_back(limits, free_plan,
                                                                     redis_server):
    add_rule("free-ip", free_plan, burst=5)
    client = Client()
    client.get("/hello/")
    redis_server.kill()
    get_all(client, ["/hello/"] * 4)
    assert limiter().breaker.state == "open"
    redis_server.start()  # same port, empty: buckets and scripts are gone

    opened_at = time.monotonic()
    deadline = opened_at + RECOVERY_DEADLINE_S
    response = client.get("/hello/")
    while decision_of(response).degraded and time.monotonic() < deadline:
        assert response.status_code == 200
        response = client.get("/hello/")
    recovered_after = time.monotonic() - opened_at

    assert not decision_of(response).degraded, "no recovery within the deadline"
    assert limiter().breaker.state == "closed"
    assert response["RateLimit"] == '"free-ip";r=4;t=60'  # a fresh bucket, debited once
    assert recovered_after < RECOVERY_DEADLINE_S


def test_failed_trial_keeps_the_breaker_open_while_redis_is_still_down(limits, free_plan,
                                                                      redis_server):
    add_rule("free-ip", free_plan)
    client = Client()
    client.get("/hello/")
    redis_server.kill()
    get_all(client, ["/hello/"] * 3)
    breaker = limiter().breaker
    deadline = time.monotonic() + RECOVERY_DEADLINE_S
    while breaker.times_opened < 2 and time.monotonic() < deadline:
        assert client.get("/hello/").status_code == 200  # the trial runs and fails
    assert breaker.times_opened == 2
    assert breaker.state == "open"


# --- scripts lost: NOSCRIPT --------------------------------------------------------------------

def ip_request():
    return RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.10")


def test_script_flush_is_handled_and_the_next_decision_is_correct(limits, free_plan,
                                                                 redis_server, redis_client):
    add_rule("free-ip", free_plan, burst=3)
    errors = limiter().stats.redis_errors
    assert decide(ip_request(), AnonymousUser(), "hello", now_ms=T0).allowed
    assert decide(ip_request(), AnonymousUser(), "hello", now_ms=T0).allowed
    loads = redis_server.command_calls("script|load")
    redis_client.script_flush()
    assert redis_client.script_exists(TAKE_SHA) == [False]

    third = decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
    assert third.allowed and not third.degraded
    assert third.policies[0].remaining == 0          # the bucket kept its state
    assert redis_server.command_calls("script|load") == loads + 1  # reloaded once
    fourth = decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
    assert not fourth.allowed and fourth.violated == ("free-ip",)
    assert limiter().stats.redis_errors == errors  # NOSCRIPT never counted as an outage


def test_restart_without_breaker_trip_reloads_the_script(limits, free_plan, redis_server):
    add_rule("free-ip", free_plan, burst=3)
    client = Client()
    client.get("/hello/")
    redis_server.kill()
    redis_server.start()  # no request saw it down: the pool reconnects, the script is gone
    response = client.get("/hello/")
    assert response.status_code == 200 and not decision_of(response).degraded
    assert response["RateLimit"] == '"free-ip";r=2;t=60'
    assert redis_server.command_calls("script|load") == 1  # after NOSCRIPT
    assert redis_server.command_calls("evalsha") == 2  # the NOSCRIPT attempt and the retry


# --- config version across a Redis restart ------------------------------------------------------

def test_a_change_made_after_a_redis_restart_is_not_mistaken_for_the_old_version(
        limits, free_plan, redis_server):
    add_rule("free-ip", free_plan)
    limiter().bump_config_version()
    assert [r.name for r in limiter().snapshot().rules] == ["free-ip"]
    redis_server.kill()
    redis_server.start()  # the version counter is gone with the data
    add_rule("new-rule", free_plan, endpoint="hello")
    limiter().bump_config_version()  # what the commit hook of the edit does

    decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)  # its reply: a new version
    decision = decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
    assert [p.name for p in decision.policies] == ["free-ip", "new-rule"]
