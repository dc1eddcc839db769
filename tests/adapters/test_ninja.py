"""The Django Ninja adapter (ratelimit_app/ninja.py) around the real engine and Redis: the caller
taken from Ninja's auth, sync and async operations, the API's, a router's and an operation's
throttle, one charge per request with QuotaMiddleware, refusals as Ninja responses with the
problem body and Retry-After, and endpoint costs naming operations. The APIs are
tests/adapters/ninja_api.py's."""

import json

import pytest

pytest.importorskip("ninja")

from django.test import Client  # noqa: E402

from ratelimit_app.config.endpoints import list_endpoints  # noqa: E402
from ratelimit_app.models import EndpointCost, Plan, Rule  # noqa: E402

from ..helpers import limiter  # noqa: E402
from .test_adapters import decision_of, demo  # noqa: E402,F401

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.adapters.ninja_urls")]

BOB = {"HTTP_X_USER_KEY": "key-bob"}  # the demo's pro user, through Ninja's APIKeyHeader


def identity_of(response):
    identity = decision_of(response).identity
    return identity.kind, identity.display, identity.plan


def remaining(response, policy):
    """The ``r`` of ``policy``'s member of the RateLimit field."""
    for member in response.headers["RateLimit"].split(", "):
        name, *params = member.split(";")
        if name == f'"{policy}"':
            return int(dict(p.split("=") for p in params)["r"])
    raise AssertionError(f"{policy} not in {response.headers['RateLimit']}")


# --- the caller, from Ninja's auth -------------------------------------------------------------

@pytest.mark.parametrize("path", ["/ninja/keyed", "/ninja/async-keyed"])
def test_the_caller_is_the_user_an_api_key_header_returned(demo, path):
    response = Client().get(path, **BOB)
    assert response.status_code == 200
    assert identity_of(response) == ("user", "bob", "pro")
    assert remaining(response, "pro-user") == 199  # pro-user: burst 200


def test_the_caller_is_the_user_a_bearer_token_returned(demo):
    response = Client().get("/ninja/bearer", HTTP_AUTHORIZATION="Bearer token-carol")
    assert response.status_code == 200
    assert identity_of(response) == ("user", "carol", "enterprise")


@pytest.mark.parametrize("path", ["/ninja/session", "/ninja/async-session"])
def test_the_caller_is_the_session_user(demo, path, django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.get(username="carol"))
    response = client.get(path)
    assert response.status_code == 200, response.content
    assert identity_of(response) == ("user", "carol", "enterprise")


@pytest.mark.parametrize("path", ["/ninja/items", "/ninja/async-items"])
def test_an_operation_without_auth_limits_the_client_ip(demo, path):
    response = Client().get(path)
    assert identity_of(response) == ("anonymous", "127.0.0.1", "free")
    assert remaining(response, "free-ip") == 39  # free-ip: burst 40


def test_the_apps_own_api_keys_are_read_as_everywhere(demo):
    response = Client(HTTP_X_API_KEY="rk_alice_free").get("/ninja/items")
    assert decision_of(response).identity.kind == "key"


@pytest.mark.parametrize("path", ["/ninja/keyed", "/ninja/async-keyed"])
def test_a_wrong_key_in_ninjas_own_header_is_a_failed_authentication(demo, path):
    statuses = [Client().get(path, HTTP_X_USER_KEY="key-nobody").status_code
                for _ in range(11)]
    assert statuses == [401] * 10 + [429]


def test_a_401_without_a_key_is_no_failed_authentication(demo, client):
    # no key sent, or only a (signed-out) session cookie: never charged as a failed one
    client.cookies["sessionid"] = "signed-out"
    assert [client.get("/ninja/keyed").status_code for _ in range(12)] == [401] * 12
    assert [client.get("/ninja/session").status_code for _ in range(12)] == [401] * 12


def test_a_failed_ninja_authentication_is_charged_as_one(demo):
    # Ninja's 401 comes before the throttle; a 401 to credentials sent in Authorization is a
    # failed authentication (guard.authentication_failed), 10 per client IP
    statuses = [Client().get("/ninja/bearer", HTTP_AUTHORIZATION="Bearer token-nobody")
                .status_code for _ in range(11)]
    assert statuses == [401] * 10 + [429]


# --- one decision per request ------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/ninja/keyed", "/ninja/async-keyed", "/ninja/twice",
                                  "/ninja-parts/router/routed"])
def test_a_request_is_charged_once_with_the_middleware_installed(demo, redis_server, path):
    Client().get(path, **BOB)  # the rules compiled, the script loaded
    calls = redis_server.command_calls("evalsha")
    response = Client().get(path, **BOB)
    assert response.status_code == 200
    assert redis_server.command_calls("evalsha") == calls + 1
    assert remaining(response, "pro-user" if "keyed" in path or "routed" in path
                     else "free-ip") in (198, 38)


def test_the_throttle_decides_alone_without_the_middleware(demo, settings, redis_server):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "QuotaMiddleware" not in m]
    response = Client().get("/ninja/keyed", **BOB)
    assert response.status_code == 200
    assert identity_of(response) == ("user", "bob", "pro")
    assert "RateLimit" not in response.headers  # Ninja gives a throttle no response


def test_routers_and_operations_are_throttled_and_the_rest_left_to_the_middleware(demo):
    # the router's and the operation's QuotaThrottle see Ninja's user; QuotaMiddleware decides
    # the unthrottled operation before Ninja authenticates, so it sees the client IP
    assert identity_of(Client().get("/ninja-parts/router/routed", **BOB))[0] == "user"
    assert identity_of(Client().get("/ninja-parts/operation", **BOB))[0] == "user"
    response = Client().get("/ninja-parts/middleware", **BOB)
    assert response.status_code == 200
    assert identity_of(response)[0] == "anonymous"
    assert decision_of(response).endpoint == "ninja-parts:middleware_decided"
    assert "RateLimit" in response.headers


def test_a_limiter_failure_never_fails_the_operation(demo, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(limiter(), "decide", broken)
    monkeypatch.setattr(limiter(), "adecide", broken)
    for path in ("/ninja/keyed", "/ninja/async-keyed"):
        response = Client().get(path, **BOB)
        assert response.status_code == 200
        assert decision_of(response).degraded == "error"


# --- @ratelimit_exempt on an operation ---------------------------------------------------------

EXEMPT_OPERATIONS = ["/ninja/health", "/ninja/async-health", "/ninja-parts/exempt",
                     "/ninja-parts/exempt-throttled"]


@pytest.mark.parametrize("middleware", [True, False], ids=["middleware", "throttle-alone"])
@pytest.mark.parametrize("path", EXEMPT_OPERATIONS)
def test_an_exempt_operation_is_never_charged_nor_decided(demo, settings, redis_server, path,
                                                          middleware):
    # Ninja serves every operation through one view: the mark is read from the operation's
    # function, by QuotaMiddleware and by the throttle (API-wide, router or operation alike)
    if not middleware:
        settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "QuotaMiddleware" not in m]
    tight_rule(burst=1)
    client = Client()
    assert client.get("/ninja-parts/operation", **BOB).status_code == 200  # script loaded
    calls = redis_server.command_calls("evalsha")
    responses = [client.get(path, **BOB) for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3  # bob has no token left
    assert redis_server.command_calls("evalsha") == calls  # no Redis call at all
    assert all(decision_of(r) is None and "RateLimit" not in r.headers for r in responses)
    assert client.get("/ninja-parts/operation", **BOB).status_code == 429  # bob's limit holds
    # and the calls are counted: a limited operation beside them makes its one call
    assert client.get("/ninja/items").status_code == 200
    assert redis_server.command_calls("evalsha") == calls + 1


def test_the_admin_does_not_offer_exempt_operations():
    endpoints = {endpoint.name: endpoint for endpoint in list_endpoints()}
    for name in ("ninja:health", "ninja:health_async", "ninja-parts:exempt_from_the_middleware",
                 "ninja-parts:exempt_from_the_throttle"):
        assert endpoints[name].exempt, name
    assert not endpoints["ninja:list_items"].exempt


# --- refusals ----------------------------------------------------------------------------------

def tight_rule(endpoint="", burst=2):
    Rule.objects.create(name="ninja-tight", plan=Plan.objects.get(slug="pro"), scope="user",
                        endpoint=endpoint, rate=1, period_s=3600, burst=burst)


@pytest.mark.parametrize("path", ["/ninja/keyed", "/ninja/async-keyed",
                                  "/ninja-parts/operation"])
def test_a_refusal_is_a_ninja_problem_response_with_retry_after(demo, path):
    tight_rule()
    client = Client()
    statuses = [client.get(path, **BOB).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    refused = client.get(path, **BOB)
    assert refused.status_code == 429
    assert refused.headers["Content-Type"] == "application/problem+json"
    body = json.loads(refused.content)
    assert body["type"].endswith("#quota-exceeded")
    assert body["violated-policies"] == ["ninja-tight"]
    retry_after = int(refused.headers["Retry-After"])
    assert 3000 <= retry_after <= body["retry-after"] + 3600  # an hour's token, with jitter
    assert body["retry-after"] == retry_after
    assert '"ninja-tight";r=0' in refused.headers["RateLimit"]
    assert "ninja-tight" in refused.headers["RateLimit-Policy"]


def test_a_refused_request_is_not_charged_again_and_never_reaches_the_operation(demo):
    tight_rule(burst=1)
    client = Client()
    assert client.get("/ninja/keyed", **BOB).status_code == 200
    refused = client.get("/ninja/keyed", **BOB)
    assert refused.status_code == 429
    assert b"bob" not in refused.content
    assert decision_of(client.get("/ninja/keyed", **BOB)).violated == ("ninja-tight",)


def test_a_request_costing_more_than_a_bucket_holds_has_no_retry_after(demo):
    tight_rule(burst=2)
    EndpointCost.objects.create(endpoint="ninja:keyed", method="GET", cost=3)
    refused = Client().get("/ninja/keyed", **BOB)
    assert refused.status_code == 429
    assert "Retry-After" not in refused.headers
    assert "can never be served" in json.loads(refused.content)["detail"]


def test_another_throttles_refusal_keeps_ninjas_answer(demo):
    from ninja.errors import Throttled

    from tests.adapters.ninja_api import api

    request = Client().get("/ninja/items").wsgi_request
    handler = api._lookup_exception_handler(Throttled(wait=1))
    response = handler(request, Throttled(wait=1))  # decided and allowed by the quotas
    assert response.status_code == 429
    assert json.loads(response.content) == {"detail": "Too many requests."}


# --- endpoint costs name Ninja operations -------------------------------------------------------

def test_a_cost_names_the_operation_of_its_method_on_a_shared_path(demo):
    # GET and POST /ninja/items are two operations on one Ninja path view
    EndpointCost.objects.create(endpoint="ninja:create_item", method="*", cost=5)
    client = Client()
    listed = client.get("/ninja/items")
    created = client.post("/ninja/items")
    assert decision_of(listed).endpoint == "ninja:list_items"
    assert decision_of(created).endpoint == "ninja:create_item"
    assert (decision_of(listed).cost, decision_of(created).cost) == (1, 5)
    assert remaining(listed, "free-ip") - remaining(created, "free-ip") == 5


def test_an_endpoint_rule_names_a_routed_operation(demo):
    tight_rule(endpoint="ninja-parts:routed", burst=1)
    client = Client()
    assert [client.get("/ninja-parts/router/routed", **BOB).status_code for _ in range(2)] \
        == [200, 429]
    assert client.get("/ninja-parts/operation", **BOB).status_code == 200  # another endpoint


def test_the_admin_offers_each_ninja_operation_as_an_endpoint():
    endpoints = {endpoint.name: endpoint for endpoint in list_endpoints()}
    listed, created = endpoints["ninja:list_items"], endpoints["ninja:create_item"]
    assert (listed.route, listed.methods) == ("/ninja/items", ("GET",))
    assert (created.route, created.methods) == ("/ninja/items", ("POST",))
    assert created.view == "tests.adapters.ninja_api.create_item"
    assert created.label == "ninja:create_item — POST /ninja/items " \
                            "(tests.adapters.ninja_api.create_item)"
    assert "ninja-parts:routed" in endpoints
    assert endpoints["ninja-parts:routed"].route == "/ninja-parts/router/routed"


def test_an_exempt_path_leaves_only_quota_throttled_operations(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EXEMPT_PATHS": ["/ninja-parts/"]}
    endpoints = {endpoint.name: endpoint for endpoint in list_endpoints()}
    assert not endpoints["ninja-parts:routed"].exempt  # QuotaThrottle decides it anyway
    assert endpoints["ninja-parts:middleware_decided"].exempt



def test_the_admins_cost_form_offers_and_accepts_a_ninja_operation(demo):
    from ratelimit_app.admin.forms import EndpointCostForm

    form = EndpointCostForm()
    offered = dict(form.fields["endpoint"].choices)
    assert offered["ninja:create_item"].startswith("ninja:create_item — POST /ninja/items")
    form = EndpointCostForm(data={"endpoint": "ninja:create_item", "method": "POST",
                                  "cost": 3, "minimum": 0})
    assert form.is_valid(), form.errors
    form.save()
    response = Client().post("/ninja/items")
    assert decision_of(response).cost == 3


# --- async operations: what runs on the event loop ---------------------------------------------

def the_apis_throttle():
    from tests.adapters.ninja_api import api

    (throttle,) = api.throttle if isinstance(api.throttle, list) else [api.throttle]
    return throttle


def test_with_the_middleware_an_async_operation_decides_on_the_loop_without_a_thread(
        demo, monkeypatch):
    # QuotaMiddleware loaded the rules and the session user before the operation
    monkeypatch.setattr(the_apis_throttle(), "_worker", None)
    for path in ("/ninja/async-keyed", "/ninja/async-items", "/ninja/async-session"):
        assert Client().get(path, **BOB).status_code in (200, 401)
    assert the_apis_throttle()._worker is None


@pytest.mark.django_db(transaction=True)  # the worker thread's connection sees the rows
def test_without_the_middleware_an_async_operation_loads_in_a_worker_thread(settings):
    from tests.helpers import load_demo_data

    load_demo_data()
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "QuotaMiddleware" not in m]
    response = Client().get("/ninja/async-keyed", **BOB)  # cold rules: the database
    assert response.status_code == 200
    assert identity_of(response) == ("user", "bob", "pro")
    assert not decision_of(response).degraded
    assert the_apis_throttle()._worker is not None


def test_the_memo_of_path_views_stays_bounded_and_still_names_operations(demo):
    from django.urls import resolve

    from ratelimit_app.config.ninja_operations import path_view_of

    memo = path_view_of.__self__
    ninja_callback = resolve("/ninja/keyed").func
    assert path_view_of(ninja_callback) is not None
    # URLconfs rebuilt again and again bring new callbacks: the memo starts afresh when full
    for _ in range(memo.MAX_CALLBACKS + 10):
        assert path_view_of(lambda request: None) is None
        assert len(memo) <= memo.MAX_CALLBACKS
    assert path_view_of(ninja_callback) is not None
    response = Client().get("/ninja/keyed", **BOB)
    assert response.status_code == 200 and "RateLimit" in response.headers
