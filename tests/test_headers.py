"""RateLimit-Policy / RateLimit (draft-ietf-httpapi-ratelimit-headers-10), Retry-After and the
429 problem body, parsed with a real RFC 9651 structured-field parser."""

import json

import http_sfv
import pytest
from django.test import Client

from ratelimit_app.headers import retry_after_with_jitter
from ratelimit_app.keys import scope_token
from ratelimit_app.models import Plan, Rule, Scope

from .helpers import load_demo_data, use_fake_clock

MIDDLEWARE_PATH = "ratelimit_app.middleware.QuotaMiddleware"
ALICE_KEY = "rk_demo_alice_free"
ANONYMOUS_TOKEN = scope_token("ip", "127.0.0.1")  # the test client's REMOTE_ADDR


@pytest.fixture
def demo(db):
    load_demo_data()


@pytest.fixture
def clock(monkeypatch):
    return use_fake_clock(monkeypatch)


def parse_list(value):
    """Parse an RFC 9651 List (raises on anything that is not one)."""
    parsed = http_sfv.List()
    parsed.parse(value.encode("ascii"))
    return parsed


def policies(response, header):
    """Return [(name, params)] of a RateLimit or RateLimit-Policy header, checking each item
    is an sf-string with exactly the draft's parameters."""
    expected_params = {"RateLimit-Policy": {"q", "w"}, "RateLimit": {"r", "t"}}[header]
    result = []
    for item in parse_list(response[header]):
        assert type(item.value) is str  # an sf-string, not a token
        params = dict(item.params)
        assert set(params) == expected_params
        assert all(type(v) is int and v >= 0 for v in params.values())
        result.append((item.value, params))
    return result


def limit_state(response):
    """Return {name: (q, w, r, t)} after checking both headers list the same policies."""
    policy = policies(response, "RateLimit-Policy")
    state = policies(response, "RateLimit")
    assert [name for name, _ in policy] == [name for name, _ in state]
    return {name: (p["q"], p["w"], s["r"], s["t"])
            for (name, p), (_, s) in zip(policy, state)}


def hammer(client, path, times, **extra):
    return [client.get(path, **extra).status_code for _ in range(times)]


# --- allowed responses ---------------------------------------------------------------------

def test_plain_view_allowed_response_carries_both_headers_with_exact_numbers(demo, clock, client):
    response = client.get("/hello/")
    assert response.status_code == 200
    assert "Retry-After" not in response
    # anonymous on the free plan: global, free-plan, free-ip (widest first); free-user needs a
    # signed-in caller. t is the time until the next whole token.
    assert list(limit_state(response).items()) == [
        ("global", (500, 1, 999, 1)),
        ("free-plan", (3000, 60, 2999, 1)),
        ("free-ip", (20, 60, 39, 3)),
    ]


def test_drf_view_allowed_response_carries_headers_of_every_policy(demo, clock, client):
    response = client.get("/api/items/", HTTP_X_API_KEY=ALICE_KEY)
    assert response.status_code == 200
    assert limit_state(response) == {
        "global": (500, 1, 999, 1),
        "free-plan": (3000, 60, 2999, 1),
        "free-ip": (20, 60, 39, 3),
        "free-user": (60, 60, 29, 1),
    }


def test_remaining_counts_the_endpoint_cost_and_shadow_policies_are_not_shown(demo, clock, client):
    response = client.get("/api/search/")  # cost 5; "search-ip-trial" is a shadow rule
    state = limit_state(response)
    assert "search-ip-trial" not in state
    assert state["free-ip"] == (20, 60, 35, 3)
    assert state["global"] == (500, 1, 995, 1)


def test_remaining_and_reset_follow_the_refill(demo, clock, client):
    hammer(client, "/hello/", 10)
    clock.advance(2_000)  # 20 per 60 s: 2 s is 2/3 of a token, 1 s to the next whole one
    assert limit_state(client.get("/hello/"))["free-ip"] == (20, 60, 29, 1)


def test_exempt_path_has_no_headers(demo, clock, client):
    response = client.get("/health/")
    assert response.status_code == 200
    assert "RateLimit" not in response and "RateLimit-Policy" not in response


# --- denied responses ----------------------------------------------------------------------

def test_plain_view_denial_has_headers_retry_after_and_problem_body(demo, clock, client):
    assert hammer(client, "/hello/", 40) == [200] * 40
    response = client.get("/hello/")
    assert response.status_code == 429
    state = limit_state(response)
    assert state["free-ip"] == (20, 60, 0, 3)  # one token (cost 1) in 3 s
    retry_after = int(response["Retry-After"])
    assert retry_after == retry_after_with_jitter(3, ANONYMOUS_TOKEN)
    assert 3 <= retry_after <= 4
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["status"] == 429 and body["title"] == "Too Many Requests"
    assert body["violated_policies"] == ["free-ip"]
    assert body["retry_after"] == retry_after
    assert "free-ip" in body["detail"] and f"{retry_after} s" in body["detail"]


def test_denied_t_is_time_until_this_requests_cost_is_available(demo, clock, client):
    for _ in range(8):  # 8 searches of cost 5 empty free-ip's 40 tokens
        assert client.get("/api/search/").status_code == 200
    response = client.get("/api/search/")
    assert response.status_code == 429
    assert limit_state(response)["free-ip"] == (20, 60, 0, 15)  # 5 tokens at 3 s each
    assert int(response["Retry-After"]) >= 15
    clock.advance(14_999)
    assert client.get("/api/search/").status_code == 429
    clock.advance(1)
    assert client.get("/api/search/").status_code == 200


def test_retry_after_counts_down_with_the_clock_and_request_passes_at_t(settings, demo, clock,
                                                                         client):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "RETRY_AFTER_JITTER_S": 0}
    hammer(client, "/hello/", 40)
    clock.advance(2_001)
    response = client.get("/hello/")
    assert limit_state(response)["free-ip"][3] == 1
    assert response["Retry-After"] == "1"
    clock.advance(998)  # 1 ms before the token is complete
    assert client.get("/hello/").status_code == 429
    clock.advance(1)
    response = client.get("/hello/")
    assert response.status_code == 200
    assert limit_state(response)["free-ip"] == (20, 60, 0, 3)


def test_drf_429_is_replaced_by_the_same_problem_body_under_the_middleware(demo, clock, client):
    hammer(client, "/hello/", 40)
    plain = client.get("/hello/")
    drf = client.get("/api/items/")
    assert drf.status_code == 429
    assert drf["Content-Type"] == "application/problem+json"
    assert drf["Retry-After"] == plain["Retry-After"]
    assert json.loads(drf.content) == json.loads(plain.content)
    assert limit_state(drf)["free-ip"] == (20, 60, 0, 3)


def test_drf_throttled_sets_retry_after_from_the_throttle_without_middleware(settings, demo,
                                                                              clock):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE_PATH]
    client = Client()
    assert hammer(client, "/api/items/", 40) == [200] * 40
    response = client.get("/api/items/")
    assert response.status_code == 429
    # DRF's own response: Retry-After is QuotaThrottle.wait(), the decision's retry time
    assert response["Retry-After"] == str(retry_after_with_jitter(3, ANONYMOUS_TOKEN))
    assert response.wsgi_request.ratelimit.retry_after_s == int(response["Retry-After"])
    assert "throttled" in json.loads(response.content)["detail"]


def test_cached_denials_carry_the_same_headers(demo, clock, client):
    hammer(client, "/hello/", 41)
    response = client.get("/hello/")
    assert response.wsgi_request.ratelimit.from_deny_cache
    assert response.status_code == 429
    assert limit_state(response)["free-ip"] == (20, 60, 0, 3)
    assert int(response["Retry-After"]) >= 3


# --- several violated policies, jitter -----------------------------------------------------

@pytest.fixture
def ip_rule(db):
    """Anonymous callers get one request per 10 s per IP."""
    plan = Plan.objects.create(slug="tight", name="Tight", default_for_anonymous=True)
    Rule.objects.create(name="ip-slow", plan=plan, scope=Scope.IP, rate=1, period_s=10, burst=1)


@pytest.fixture
def two_tight_rules(ip_rule):
    Rule.objects.create(name="global-fast", scope=Scope.GLOBAL, rate=1, period_s=4, burst=1)


def test_retry_after_is_the_largest_t_of_the_violated_policies(settings, two_tight_rules, clock,
                                                                client):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "RETRY_AFTER_JITTER_S": 0}
    assert client.get("/hello/").status_code == 200
    response = client.get("/hello/")
    assert response.status_code == 429
    state = limit_state(response)
    assert state == {"global-fast": (1, 4, 0, 4), "ip-slow": (1, 10, 0, 10)}
    assert response["Retry-After"] == "10"  # jitter 0: exactly the largest t
    body = json.loads(response.content)
    assert sorted(body["violated_policies"]) == ["global-fast", "ip-slow"]


def test_retry_after_jitter_is_deterministic_per_identity_and_bounded(settings, ip_rule, clock):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "RETRY_AFTER_JITTER_S": 5}
    seen = set()
    for i in range(1, 9):
        client = Client(REMOTE_ADDR=f"198.51.100.{i}")
        assert client.get("/hello/").status_code == 200
        retries = {int(client.get("/hello/")["Retry-After"]) for _ in range(3)}
        assert len(retries) == 1  # the same identity always gets the same value
        retry = retries.pop()
        assert 10 <= retry <= 15
        assert retry == retry_after_with_jitter(10, scope_token("ip", f"198.51.100.{i}"))
        seen.add(retry)
    assert len(seen) > 1  # different identities are spread out


def test_jitter_function_range_and_zero_setting(settings):
    tokens = [scope_token("ip", f"203.0.113.{i}") for i in range(200)]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "RETRY_AFTER_JITTER_S": 3}
    values = [retry_after_with_jitter(7, t) for t in tokens]
    assert set(values) == {7, 8, 9, 10}
    assert values == [retry_after_with_jitter(7, t) for t in tokens]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "RETRY_AFTER_JITTER_S": 0}
    assert {retry_after_with_jitter(7, t) for t in tokens} == {7}


# --- policy names ----------------------------------------------------------------------------

def test_odd_policy_names_are_serialised_as_valid_sf_strings(db, clock, client):
    # Names bypassing Rule.clean() (created in code, not in the admin) must still give valid
    # headers: non-printable and non-ASCII characters dropped, quote and backslash escaped.
    plan = Plan.objects.create(slug="odd", name="Odd", default_for_anonymous=True)
    names = ['say "hi"', "back\\slash", "a, b;q=1", "ünï😀", "cr\r\nlf\x00nul", "tab\there"]
    for rate, name in enumerate(names, start=1):
        Rule.objects.create(name=name, plan=plan, scope=Scope.IP, rate=rate, period_s=60,
                            burst=100)
    response = client.get("/hello/")
    assert response.status_code == 200
    state = limit_state(response)
    assert list(state) == ['say "hi"', "back\\slash", "a, b;q=1", "n", "crlfnul", "tabhere"]
    assert [q for q, _, _, _ in state.values()] == [1, 2, 3, 4, 5, 6]
