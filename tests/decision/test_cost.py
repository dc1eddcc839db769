"""What a request costs: EndpointCost rows, the optional cost header, endpoint rules."""

import pytest
from django.test import Client, RequestFactory

from ratelimit_app.decision.engine import plan_buckets, request_cost
from ratelimit_app.decision.identity import identify
from ratelimit_app.models import EndpointCost, Plan

from ..helpers import limiter, load_demo_data, use_fake_clock

factory = RequestFactory()


@pytest.fixture
def demo(db):
    load_demo_data()  # api:search GET costs 5, api:reports POST 20; MAX_COST is 50


def by_name(decision):
    return {status.name: status for status in decision.policies}


def test_most_specific_endpoint_cost_row_wins(demo):
    pro, enterprise = Plan.objects.get(slug="pro"), Plan.objects.get(slug="enterprise")
    EndpointCost.objects.create(endpoint="api:search", method="*", cost=3)
    EndpointCost.objects.create(endpoint="api:search", method="GET", plan=pro, cost=2)
    EndpointCost.objects.create(endpoint="api:search", method="*", plan=enterprise, cost=4)
    snapshot = limiter().snapshot()
    assert snapshot.cost_for("api:search", "GET", "free") == 5      # endpoint + method
    assert snapshot.cost_for("api:search", "POST", "free") == 3     # endpoint, any method
    assert snapshot.cost_for("api:search", "GET", "pro") == 2       # plan + method
    assert snapshot.cost_for("api:search", "POST", "pro") == 3      # no pro row for POST
    assert snapshot.cost_for("api:search", "GET", "enterprise") == 4  # plan, any method
    assert snapshot.cost_for("api:items", "GET", "free") == 1       # no row: one token
    assert snapshot.cost_for("", "GET", None) == 1                  # unresolved URL


def cost_with_header(value, endpoint="api:reports", method="post"):
    request = getattr(factory, method)("/x/", HTTP_X_REQUEST_COST=value)
    return request_cost(limiter().snapshot(), request, endpoint, "free")


@pytest.mark.parametrize("value, cost", [
    ("7", 7), (" 7 ", 7), ("1", 1), ("50", 50),
    ("51", 50), ("1000", 50), ("999999999999", 50),     # clamped to MAX_COST
    ("0007", 7), ("1" * 13, 50), ("18446744073709551616", 50), ("9" * 10_000, 50),  # D9
])
def test_cost_header_is_used_and_clamped(demo, value, cost):
    assert cost_with_header(value, endpoint="api:items", method="get") == cost


@pytest.mark.parametrize("value, cost", [("1", 20), ("19", 20), ("30", 30), ("500", 50)])
def test_cost_header_can_raise_but_never_lower_the_endpoint_cost(demo, value, cost):
    assert cost_with_header(value) == cost


@pytest.mark.parametrize("value", [
    "", "   ", "abc", "-3", "0", "+5", "5.0", "1e3", "0x10", "٣", "５", "5\x00", "5\r\n6",
    "0" * 30, "x" * 10_000, "²", "1²",
])
def test_bad_cost_header_falls_back_to_the_endpoint_cost(demo, value):
    assert cost_with_header(value) == 20
    assert cost_with_header(value, endpoint="api:items", method="get") == 1


def test_head_is_charged_like_get_unless_a_row_names_head(demo):
    # D2: Django serves HEAD with the GET view, so it costs what GET costs (api:search GET is 5)
    snapshot = limiter().snapshot()
    assert snapshot.cost_for("api:search", "HEAD", "free") == 5
    assert snapshot.cost_for("api:search", "HEAD", "pro") == 5
    EndpointCost.objects.create(endpoint="api:search", method="HEAD", cost=2)
    limiter().policies.reset()  # (the commit hook that would do it does not run inside a test transaction)
    assert limiter().snapshot().cost_for("api:search", "HEAD", "free") == 2
    assert limiter().snapshot().cost_for("api:search", "GET", "free") == 5


def test_head_is_charged_like_get_in_redis(demo, monkeypatch):
    use_fake_clock(monkeypatch)
    response = Client().head("/api/search/", HTTP_X_API_KEY="rk_bob_pro")
    assert response.status_code == 200
    decision = response.wsgi_request.ratelimit
    assert decision.cost == 5
    assert by_name(decision)["pro-user"].remaining == by_name(decision)["pro-user"].burst - 5


def test_cost_header_is_ignored_when_not_configured(settings, demo):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "COST_HEADER": None}
    assert cost_with_header("7") == 20


def test_max_cost_setting(settings, demo):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "MAX_COST": 10}
    assert cost_with_header("30", endpoint="api:items", method="get") == 10
    assert cost_with_header("30") == 20  # MAX_COST bounds the header, not the endpoint cost


def test_endpoint_rules_are_charged_one_token_per_request(demo):
    snapshot = limiter().snapshot()
    request = factory.post("/api/reports/", HTTP_X_API_KEY="rk_alice_free")
    identity = identify(request, None, snapshot)
    costs = {b.rule.name: b.cost for b in plan_buckets(snapshot, identity, "api:reports", 20)}
    assert costs == {"global": 20, "free-plan": 20, "free-ip": 20, "free-user": 20,
                     "free-reports": 1, "auth-failures": 1}  # the failed-auth gate: checked only


def test_a_request_is_charged_its_cost_in_redis(demo):
    client = Client()
    response = client.post("/api/reports/", HTTP_X_API_KEY="rk_alice_free")
    assert response.status_code == 202
    decision = response.wsgi_request.ratelimit
    assert decision.cost == 20
    policies = by_name(decision)
    assert policies["free-user"].remaining == 30 - 20
    assert policies["free-reports"].remaining == 5 - 1
    # a second report does not fit in free-user's 10 tokens: denied, nothing debited
    response = client.post("/api/reports/", HTTP_X_API_KEY="rk_alice_free")
    assert response.status_code == 429
    assert by_name(response.wsgi_request.ratelimit)["free-reports"].remaining == 4


def test_cost_header_through_the_stack(demo, monkeypatch):
    use_fake_clock(monkeypatch)  # no refill between the two requests
    client = Client()
    response = client.get("/api/items/", HTTP_X_REQUEST_COST="7")
    assert response.wsgi_request.ratelimit.cost == 7
    assert by_name(response.wsgi_request.ratelimit)["free-ip"].remaining == 40 - 7
    response = client.get("/api/items/", HTTP_X_REQUEST_COST="lots")
    assert response.status_code == 200
    assert response.wsgi_request.ratelimit.cost == 1
    assert by_name(response.wsgi_request.ratelimit)["free-ip"].remaining == 40 - 7 - 1


# --- D4: a cost above a bucket's capacity can never pass --------------------------------------

@pytest.mark.parametrize("path", ["/api/items/", "/hello/"])  # throttle and middleware
def test_a_cost_above_capacity_is_refused_without_a_retry_promise(demo, monkeypatch, path):
    import json

    use_fake_clock(monkeypatch)
    client = Client()
    # free-user holds at most 30 tokens: a request declaring 50 can never pass, however long
    # the client waits
    response = client.get(path, HTTP_X_API_KEY="rk_alice_free", HTTP_X_REQUEST_COST="50")
    assert response.status_code == 429
    assert "Retry-After" not in response
    decision = response.wsgi_request.ratelimit
    assert set(decision.over_capacity) == {"free-user", "free-ip"}  # 30 and 40 < 50
    body = json.loads(response.content)
    assert "capacity" in body["detail"] and "free-user" in body["detail"]
    assert "retry-after" not in body and "retry_after" not in body
    # nothing was debited: a request that fits still has the whole bucket
    response = client.get(path, HTTP_X_API_KEY="rk_alice_free", HTTP_X_REQUEST_COST="30")
    assert response.status_code == 200
    assert by_name(response.wsgi_request.ratelimit)["free-user"].remaining == 0


def test_a_cost_within_capacity_that_does_not_fit_now_still_gets_retry_after(demo, monkeypatch):
    use_fake_clock(monkeypatch)
    client = Client()
    client.get("/hello/", HTTP_X_API_KEY="rk_alice_free", HTTP_X_REQUEST_COST="25")
    response = client.get("/hello/", HTTP_X_API_KEY="rk_alice_free", HTTP_X_REQUEST_COST="25")
    assert response.status_code == 429 and int(response["Retry-After"]) >= 1
    assert response.wsgi_request.ratelimit.over_capacity == ()
