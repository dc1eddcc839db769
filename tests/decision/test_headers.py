"""RateLimit-Policy / RateLimit (draft-ietf-httpapi-ratelimit-headers-11, wire format of -10),
Retry-After and the 429 problem body, parsed with a real RFC 9651 structured-field parser."""

import json
import math

import http_sfv
import pytest
from django.http import HttpResponse
from django.test import Client

from ratelimit_app.decision.buckets import PolicyStatus
from ratelimit_app.decision.engine import Decision
from ratelimit_app.decision.headers import (
    QUOTA_EXCEEDED,
    apply_headers,
    apply_headers_unless_set,
    problem_response,
    retry_after_with_jitter,
)
from ratelimit_app.decision.keys import scope_token
from ratelimit_app.models import Plan, Rule, Scope
from ratelimit_app.runtime.guard import HEADERS_ON_THE_WAY_OUT_ATTR
from ratelimit_app.throttling import QuotaThrottle, QuotaThrottled

from ..helpers import limiter, load_demo_data, make_bucket, make_rule, use_fake_clock

MIDDLEWARE_PATH = "ratelimit_app.middleware.QuotaMiddleware"
ALICE_KEY = "rk_alice_free"
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
    """Return {name: (q, w, r, t)}, r and t None for a policy without a RateLimit item, after
    checking RateLimit names policies of RateLimit-Policy, in the same order, with r <= q."""
    policy = policies(response, "RateLimit-Policy")
    state = dict(policies(response, "RateLimit")) if "RateLimit" in response else {}
    assert [name for name, _ in policy if name in state] == list(state)
    result = {}
    for name, params in policy:
        current = state.get(name, {})
        assert current.get("r", 0) <= params["q"]  # never more left than the quota
        result[name] = (params["q"], params["w"], current.get("r"), current.get("t"))
    return result


def no_jitter(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "RETRY_AFTER_JITTER_S": 0,
                              "RETRY_AFTER_JITTER_RATIO": 0}


def hammer(client, path, times, **extra):
    return [client.get(path, **extra).status_code for _ in range(times)]


# --- allowed responses ---------------------------------------------------------------------

def test_plain_view_allowed_response_carries_both_headers_with_exact_numbers(demo, clock, client):
    response = client.get("/hello/")
    assert response.status_code == 200
    assert "Retry-After" not in response
    # anonymous on the free plan: global, free-plan, free-ip (widest first); free-user needs a
    # signed-in caller. q is the burst, w the seconds to refill it (global: 1000 at 500/s; free-ip:
    # 40 at 20 per 60 s); r and t only for the caller's own bucket; t: until the next whole token.
    assert list(limit_state(response).items()) == [
        ("global", (1000, 2, None, None)),
        ("free-plan", (3000, 60, None, None)),
        ("free-ip", (40, 120, 39, 3)),
    ]


def test_drf_view_allowed_response_carries_headers_of_every_policy(demo, clock, client):
    response = client.get("/api/items/", HTTP_X_API_KEY=ALICE_KEY)
    assert response.status_code == 200
    assert limit_state(response) == {
        "global": (1000, 2, None, None),
        "free-plan": (3000, 60, None, None),
        "free-ip": (40, 120, 39, 3),
        "free-user": (30, 30, 29, 1),  # 60 per 60 s, burst 30: refilled in 30 s
    }


def test_remaining_counts_the_endpoint_cost_and_shadow_policies_are_not_shown(demo, clock, client):
    response = client.get("/api/search/")  # cost 5; "search-ip-trial" is a shadow rule
    state = limit_state(response)
    assert "search-ip-trial" not in state
    assert state["free-ip"] == (40, 120, 35, 3)
    assert state["global"] == (1000, 2, None, None)


def test_remaining_and_reset_follow_the_refill(demo, clock, client):
    hammer(client, "/hello/", 10)
    clock.advance(2_000)  # 20 per 60 s: 2 s is 2/3 of a token, 1 s to the next whole one
    assert limit_state(client.get("/hello/"))["free-ip"] == (40, 120, 29, 1)


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
    assert state["free-ip"] == (40, 120, 0, 3)  # one token (cost 1) in 3 s
    retry_after = int(response["Retry-After"])
    assert retry_after == retry_after_with_jitter(3, ANONYMOUS_TOKEN)
    assert 3 <= retry_after <= 5  # jitter spread: at least RETRY_AFTER_JITTER_S = 2
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    # the draft's problem type and member; the names are those of RateLimit-Policy
    assert body["type"] == "https://iana.org/assignments/http-problem-types#quota-exceeded"
    assert body["status"] == 429 and body["title"] == "Quota exceeded"
    assert body["violated-policies"] == ["free-ip"]
    assert set(body["violated-policies"]) <= set(state)
    assert "violated_policies" not in body
    assert body["retry-after"] == retry_after
    assert "free-ip" in body["detail"] and f"{retry_after} s" in body["detail"]


def test_denied_t_is_time_until_this_requests_cost_is_available(demo, clock, client):
    for _ in range(8):  # 8 searches of cost 5 empty free-ip's 40 tokens
        assert client.get("/api/search/").status_code == 200
    response = client.get("/api/search/")
    assert response.status_code == 429
    assert limit_state(response)["free-ip"] == (40, 120, 0, 15)  # 5 tokens at 3 s each
    assert int(response["Retry-After"]) >= 15
    clock.advance(14_999)
    assert client.get("/api/search/").status_code == 429
    clock.advance(1)
    assert client.get("/api/search/").status_code == 200


def test_retry_after_counts_down_with_the_clock_and_request_passes_at_t(settings, demo, clock,
                                                                         client):
    no_jitter(settings)
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
    assert limit_state(response)["free-ip"] == (40, 120, 0, 3)


def test_drf_denial_is_drfs_response_with_the_problem_fields_of_a_plain_view(demo, clock, client):
    hammer(client, "/hello/", 40)
    plain = client.get("/hello/")
    drf = client.get("/api/items/")
    assert drf.status_code == 429
    assert drf["Content-Type"] == "application/json"  # rendered by DRF, not replaced
    assert drf["Retry-After"] == plain["Retry-After"]
    assert drf.data == json.loads(drf.content) == json.loads(plain.content)
    assert limit_state(drf)["free-ip"] == (40, 120, 0, 3)


def test_drf_denial_carries_every_header_without_the_middleware(settings, demo, clock):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if m != MIDDLEWARE_PATH]
    client = Client()
    assert hammer(client, "/api/items/", 40) == [200] * 40
    response = client.get("/api/items/")
    assert response.status_code == 429
    assert response["Retry-After"] == str(retry_after_with_jitter(3, ANONYMOUS_TOKEN))
    assert response.wsgi_request.ratelimit.retry_after_s == int(response["Retry-After"])
    assert limit_state(response)["free-ip"] == (40, 120, 0, 3)  # set by QuotaThrottle itself
    assert response.data["violated-policies"] == ["free-ip"]
    allowed = Client(REMOTE_ADDR="198.51.100.9").get("/api/items/")
    assert limit_state(allowed)["free-ip"] == (40, 120, 39, 3)


def test_a_drf_views_headers_are_the_same_whether_the_middleware_or_the_throttle_sets_them(
        settings, demo, clock):
    """With QuotaMiddleware installed, it sets the headers of QuotaThrottle's decision on the
    response (the throttle then leaves DRF's view headers alone); without it, the throttle
    hands them to DRF. A client sees the same fields either way, allowed or refused."""
    no_jitter(settings)
    with_middleware = settings.MIDDLEWARE
    fields = {}
    for setter, middleware, address in (
            ("middleware", with_middleware, "198.51.100.21"),
            ("throttle", [m for m in with_middleware if m != MIDDLEWARE_PATH], "198.51.100.22")):
        settings.MIDDLEWARE = middleware
        client = Client(REMOTE_ADDR=address)
        allowed = client.get("/api/items/")
        assert hammer(client, "/api/items/", 39) == [200] * 39
        refused = client.get("/api/items/")
        assert (allowed.status_code, refused.status_code) == (200, 429)
        for response in (allowed, refused):
            assert hasattr(response.wsgi_request, HEADERS_ON_THE_WAY_OUT_ATTR) == \
                (setter == "middleware")
        fields[setter] = [[(name, value) for name, value in response.items()
                           if name in ("RateLimit-Policy", "RateLimit", "Retry-After")]
                          for response in (allowed, refused)]
    assert fields["middleware"] == fields["throttle"]
    assert [name for name, _ in fields["throttle"][1]] == [
        "Retry-After", "RateLimit-Policy", "RateLimit"]


def test_cached_denials_carry_the_same_headers(demo, clock, client):
    hammer(client, "/hello/", 41)
    response = client.get("/hello/")
    assert response.wsgi_request.ratelimit.from_deny_cache
    assert response.status_code == 429
    assert limit_state(response)["free-ip"] == (40, 120, 0, 3)
    assert int(response["Retry-After"]) >= 3


def test_a_cached_refusal_shows_only_the_levels_it_knows(db, clock):
    # a shared bucket others drained refuses the caller from this worker's memory: the caller's
    # own bucket, which the memory holds nothing of, is not shown as full (issue 56)
    plan = Plan.objects.create(slug="shared", name="Shared", default_for_anonymous=True)
    Rule.objects.create(name="shared-plan", plan=plan, scope=Scope.PLAN, rate=1,
                        period_s=3600, burst=3)
    Rule.objects.create(name="own-ip", plan=plan, scope=Scope.IP, rate=1, period_s=3600,
                        burst=10)
    caller, others = Client(REMOTE_ADDR="198.51.100.1"), Client(REMOTE_ADDR="198.51.100.2")
    assert hammer(caller, "/hello/", 2) == [200, 200]   # own-ip: 8 left
    assert hammer(others, "/hello/", 1) == [200]        # shared-plan: emptied, remembered
    refused = caller.get("/hello/")
    assert refused.status_code == 429 and refused.wsgi_request.ratelimit.from_deny_cache
    state = limit_state(refused)
    assert state["own-ip"] == (10, 36000, None, None)   # listed (configuration), level not told
    assert state["shared-plan"][2] == 0
    # every level it tells is what Redis holds
    peek = limiter().peek(refused.wsgi_request, None, refused.wsgi_request.ratelimit.endpoint)
    held = {status.name: status.remaining for status in peek.statuses}
    assert held["own-ip"] == 8
    assert all(held[name] == r for name, (_, _, r, _) in state.items() if r is not None)
    # the same refusal answered by Redis tells the caller's own level
    limiter().deny_cache.clear()
    from_redis = caller.get("/hello/")
    assert not from_redis.wsgi_request.ratelimit.from_deny_cache
    assert limit_state(from_redis)["own-ip"][2] == 8


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
    no_jitter(settings)
    assert client.get("/hello/").status_code == 200
    response = client.get("/hello/")
    assert response.status_code == 429
    state = limit_state(response)
    # the shared global bucket refused too, so its RateLimit item is given
    assert state == {"global-fast": (1, 4, 0, 4), "ip-slow": (1, 10, 0, 10)}
    assert response["Retry-After"] == "10"  # jitter 0: exactly the largest t
    body = json.loads(response.content)
    assert sorted(body["violated-policies"]) == ["global-fast", "ip-slow"]


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
    assert set(values) == {7, 8, 9, 10}  # 7 s x 0.25 rounds up to 2, below the 3 s floor
    assert values == [retry_after_with_jitter(7, t) for t in tokens]
    no_jitter(settings)
    assert {retry_after_with_jitter(7, t) for t in tokens} == {7}


def test_jitter_spread_grows_with_the_wait_and_is_never_early(settings):
    tokens = [scope_token("ip", f"203.0.113.{i}") for i in range(200)]
    values = [retry_after_with_jitter(120, t) for t in tokens]  # defaults: 2 s, 25 %
    assert min(values) >= 120 and max(values) <= 150
    assert len(set(values)) >= 25  # was 2 distinct values (120 or 121) for any number of clients
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "RETRY_AFTER_JITTER_RATIO": 0.5}
    assert max(retry_after_with_jitter(120, t) for t in tokens) > 150


def test_clients_refused_by_one_shared_bucket_are_told_different_times(db, clock):
    plan = Plan.objects.create(slug="open", name="Open", default_for_anonymous=True)
    Rule.objects.create(name="everyone", plan=plan, scope=Scope.GLOBAL, rate=1, period_s=60,
                        burst=1)
    assert Client(REMOTE_ADDR="192.0.2.1").get("/hello/").status_code == 200
    retries = []
    for i in range(2, 32):  # 30 other clients, all refused by the one global bucket
        response = Client(REMOTE_ADDR=f"192.0.2.{i}").get("/hello/")
        assert response.status_code == 429
        assert limit_state(response)["everyone"] == (1, 60, 0, 60)  # refused: r shown
        retries.append(int(response["Retry-After"]))
    assert min(retries) >= 60 and max(retries) <= 75  # 25 % of 60 s
    assert len(set(retries)) >= 8  # spread out, not two values


# --- the mapping: a client that follows the headers is never refused ---------------------------

@pytest.fixture
def small_burst_rule(db):
    """100 per 60 s, but at most 20 at once: the burst is below the rate."""
    plan = Plan.objects.create(slug="steady", name="Steady", default_for_anonymous=True)
    Rule.objects.create(name="steady-ip", plan=plan, scope=Scope.IP, rate=100, period_s=60,
                        burst=20)


def test_policy_advertises_the_burst_and_its_refill_time(small_burst_rule, clock, client):
    # q = burst (not the rate, 100, which no client could spend at once), w = 20 / (100/60 s)
    assert limit_state(client.get("/hello/"))["steady-ip"] == (20, 12, 19, 1)


def test_a_client_spending_q_per_w_is_never_refused(small_burst_rule, clock, client):
    q, w, _, _ = limit_state(client.get("/hello/"))["steady-ip"]
    clock.advance(w * 1000)
    for _ in range(5):
        statuses = hammer(client, "/hello/", q)
        assert statuses == [200] * q
        clock.advance(w * 1000)


def test_a_client_spending_r_within_t_is_never_refused(small_burst_rule, clock, client):
    response = client.get("/hello/")
    spent = 1
    for _ in range(60):
        _, _, remaining, reset_s = limit_state(response)["steady-ip"]
        for _ in range(remaining):  # all it may spend now ...
            response = client.get("/hello/")
            assert response.status_code == 200
            spent += 1
        if remaining == 0:  # ... then wait t, as told
            clock.advance(reset_s * 1000)
            response = client.get("/hello/")
            assert response.status_code == 200
            spent += 1
    assert spent > 60  # it really spent its quota, not just waited


def test_a_full_bucket_reports_the_time_of_one_token_not_zero():
    bucket = make_bucket(make_rule(rate=20, period_s=60, burst=40), cost=1)
    status = bucket.status(bucket.capacity_units, short=False)
    assert (status.remaining, status.reset_s, status.full_s) == (40, 3, 0)


@pytest.mark.parametrize("rate, period_s, burst, cost", [
    (20, 60, 40, 1), (1, 1, 1, 1), (7, 3, 11, 2), (1000, 1, 5000, 3), (3, 86400, 3, 1)])
def test_a_level_from_redis_gives_the_same_status_as_the_same_level_projected(rate, period_s,
                                                                              burst, cost):
    # Redis's whole-unit levels take an integer path; the deny cache's projections (floats)
    # the float one: both must report the same r, t and full time
    bucket = make_bucket(make_rule(rate=rate, period_s=period_s, burst=burst), cost=cost)
    step = max(1, bucket.capacity_units // 997)
    for level in [*range(0, bucket.capacity_units + 1, step), bucket.capacity_units - 1,
                  bucket.cost_units - 1, bucket.cost_units]:
        for short in (False, True):
            exact, projected = bucket.status(level, short), bucket.status(float(level), short)
            assert exact == projected, (level, short)
            assert all(type(value) is int for value in exact[4:7])


# --- shared buckets -------------------------------------------------------------------------

def test_shared_remaining_is_disclosed_only_when_configured(settings, demo, clock, client):
    carol = {"HTTP_X_API_KEY": "rk_carol_enterprise"}
    state = limit_state(client.get("/api/items/", **carol))
    # global and the tenant's bucket are shared: listed as policies, no remaining
    assert state["global"][2:] == (None, None)
    assert state["enterprise-tenant"] == (3000, 9, None, None)
    assert state["enterprise-user"][2:] == (999, 1)
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "DISCLOSE_SHARED_REMAINING": True}
    state = limit_state(client.get("/api/items/", **carol))
    assert state["global"][:2] == (1000, 2) and 990 <= state["global"][2] < 1000
    assert state["enterprise-tenant"][:2] == (3000, 9)
    assert 2990 <= state["enterprise-tenant"][2] < 3000


# --- a cost above a policy's capacity (D4): no Retry-After -----------------------------------

def over_capacity_decision():
    statuses = (
        PolicyStatus("free-ip", 20, 60, 40, 35, 3, 15, 20, False, False, "k1", 35 * 60_000, "ip"),
        PolicyStatus("free-reports", 5, 3600, 5, 5, 0, 0, 20, False, True, "k2", 5 * 3_600_000,
                     "user"),
    )
    return Decision(allowed=False, retry_after_s=9, policies=statuses,
                    violated=("free-reports",), cost=20, over_capacity=("free-reports",))


def test_a_cost_above_capacity_is_refused_without_a_retry_after():
    decision = over_capacity_decision()
    response = problem_response(decision)
    assert response.status_code == 429 and "Retry-After" not in response
    body = json.loads(response.content)
    assert body["type"] == QUOTA_EXCEEDED
    assert body["violated-policies"] == ["free-reports"]
    assert "retry-after" not in body
    assert "policy free-reports (cost 20, capacity 5)" in body["detail"]
    assert "never" in body["detail"]
    assert "Retry-After" not in apply_headers({}, decision)
    assert "RateLimit-Policy" in apply_headers({}, decision)
    # the DRF path: no wait, so DRF sends no Retry-After either
    exc = QuotaThrottled(decision)
    assert exc.wait is None and exc.detail == body
    throttle = QuotaThrottle()
    throttle.decision = decision
    assert throttle.wait() is None
    throttle.decision = decision._replace(over_capacity=())
    assert throttle.wait() == 9


def test_fields_set_directly_are_the_ones_djangos_own_setter_gives():
    """apply_headers writes an HttpResponse's field store directly (Django's setter re-checks
    values that are ASCII by construction): the fields must be exactly what setting them
    through Django gives, replace a field of the same name in another case, and be read back
    case-insensitively."""
    refused = over_capacity_decision()._replace(over_capacity=())
    for decision in (refused, refused._replace(allowed=True, retry_after_s=0, violated=())):
        direct = HttpResponse("body")
        direct["ratelimit"] = "set by the view"
        apply_headers(direct, decision)
        through_django = HttpResponse("body")
        through_django["ratelimit"] = "set by the view"
        for name, value in apply_headers({}, decision).items():
            through_django[name] = value
        assert list(direct.items()) == list(through_django.items())
        assert direct.serialize_headers() == through_django.serialize_headers()
        assert direct["RATELIMIT"] == '"free-ip";r=35;t=3, "free-reports";r=5;t=0'
        assert ("Retry-After" in direct) == (not decision.allowed)


def test_fields_a_response_set_itself_are_left_as_they_are():
    """The middleware's apply_headers_unless_set: a response whose RateLimit-Policy is set (by
    its view, in any case of the name) keeps its own fields, on an HttpResponse (whose field
    store is read directly) as on any other response class; one without gets ours."""
    decision = over_capacity_decision()._replace(over_capacity=())

    class OtherHeaders(HttpResponse):  # headers not written directly (see _field_store)
        def __init__(self, content):
            super().__init__(content)
            self.headers = dict(self.headers.items())

        def has_header(self, header):
            return header.lower() in (name.lower() for name in self.headers)

        def __setitem__(self, header, value):
            self.headers[header] = value

    for response_class in (HttpResponse, OtherHeaders):
        own = response_class("body")
        own["ratelimit-POLICY"] = '"view";q=1;w=1'
        assert apply_headers_unless_set(own, decision) is own
        assert "RateLimit" not in own.headers and "Retry-After" not in own.headers
        bare = response_class("body")
        apply_headers_unless_set(bare, decision)
        assert dict(bare.headers.items())["RateLimit"] == \
            '"free-ip";r=35;t=3, "free-reports";r=5;t=0'


# --- policy names ----------------------------------------------------------------------------

def test_odd_policy_names_are_serialised_as_valid_sf_strings(db, clock, client):
    # Names bypassing Rule.clean() (created in code, not in the admin) must still give valid
    # headers: non-printable and non-ASCII characters dropped, quote and backslash escaped.
    # (ESC, not NUL, as the control character: PostgreSQL's text columns refuse NUL.)
    plan = Plan.objects.create(slug="odd", name="Odd", default_for_anonymous=True)
    names = ['say "hi"', "back\\slash", "a, b;q=1", "ünï😀", "cr\r\nlf\x1bnul", "tab\there"]
    for rate, name in enumerate(names, start=1):
        Rule.objects.create(name=name, plan=plan, scope=Scope.IP, rate=rate, period_s=60,
                            burst=100 + rate)
    response = client.get("/hello/")
    assert response.status_code == 200
    state = limit_state(response)
    assert list(state) == ['say "hi"', "back\\slash", "a, b;q=1", "n", "crlfnul", "tabhere"]
    assert [q for q, _, _, _ in state.values()] == [101, 102, 103, 104, 105, 106]
    assert [w for _, w, _, _ in state.values()] == [
        math.ceil((100 + rate) * 60 / rate) for rate in range(1, 7)]
