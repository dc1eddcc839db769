"""The limits in the OpenAPI schemas (ratelimit_app/openapi/): drf-spectacular's, through the
postprocessing hook, and Django Ninja's, through RateLimitedOpenAPI: 429 (402 where credits
apply) with the problem schema and the rate-limit headers, costs per plan from the
EndpointCost rows, fail-closed rules named. The demo's DRF views and the Ninja APIs of
tests/adapters/ninja_api.py, the demo's rules and costs."""

import json

import pytest

pytest.importorskip("ninja")
pytest.importorskip("drf_spectacular")

from django.test import Client  # noqa: E402
from drf_spectacular.validation import validate_schema  # noqa: E402

from ratelimit_app.decision.headers import TEMPORARY_REDUCED_CAPACITY  # noqa: E402
from ratelimit_app.models import EndpointCost, Plan, Rule  # noqa: E402
from ratelimit_app.testing import RedisServer  # noqa: E402

from ..conftest import caches_for  # noqa: E402
from ..helpers import load_demo_data  # noqa: E402

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.openapi.urls")]

PLANS = ("enterprise", "free", "prepaid", "pro", "studio")
PROBLEM_REF = "#/components/schemas/RateLimitProblem"


@pytest.fixture
def demo(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
    settings.SPECTACULAR_SETTINGS = {"POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ratelimit_app.openapi.spectacular.add_rate_limits"]}
    load_demo_data()


def spectacular_schema():
    response = Client().get("/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return json.loads(response.content)


def ninja_schema(prefix="ninja"):
    response = Client().get(f"/{prefix}/openapi.json")
    assert response.status_code == 200
    return json.loads(response.content)


def assert_documents_a_refusal(operation):
    refused = operation["responses"]["429"]
    assert refused["content"]["application/problem+json"]["schema"] == {"$ref": PROBLEM_REF}
    assert set(refused["headers"]) == {"RateLimit", "RateLimit-Policy", "Retry-After"}
    assert refused["headers"]["Retry-After"] == {"$ref": "#/components/headers/Retry-After"}
    ok = operation["responses"]["200"]
    assert set(ok["headers"]) >= {"RateLimit", "RateLimit-Policy"}


# --- drf-spectacular ---------------------------------------------------------------------------

def test_every_drf_operation_documents_its_429_and_is_a_valid_schema(demo):
    schema = spectacular_schema()
    validate_schema(schema)  # OpenAPI 3.0's JSON schema: the additions are well formed
    for path, method in (("/api/items/", "get"), ("/api/search/", "get"),
                         ("/api/reports/", "post")):
        assert_documents_a_refusal(schema["paths"][path][method])
    components = schema["components"]
    assert components["schemas"]["RateLimitProblem"]["required"] == [
        "type", "title", "status", "detail", "violated-policies"]
    assert set(components["headers"]) == {"RateLimit", "RateLimit-Policy", "Retry-After"}


def test_the_cost_per_plan_is_read_from_the_endpoint_cost_rows(demo):
    # the demo: api:search GET costs 5 on every plan, api:reports POST 20; a pro row of its own
    EndpointCost.objects.create(endpoint="api:search", method="GET",
                                plan=Plan.objects.get(slug="pro"), cost=2)
    paths = spectacular_schema()["paths"]
    assert paths["/api/search/"]["get"]["x-ratelimit-cost"] == {
        "enterprise": 5, "free": 5, "prepaid": 5, "pro": 2, "studio": 5}
    assert paths["/api/reports/"]["post"]["x-ratelimit-cost"] == dict.fromkeys(PLANS, 20)
    assert paths["/api/items/"]["get"]["x-ratelimit-cost"] == dict.fromkeys(PLANS, 1)


def test_402_where_credits_apply(demo):
    # the demo's prepaid plan spends credits on every endpoint
    refused = spectacular_schema()["paths"]["/api/items/"]["get"]["responses"]["402"]
    assert refused["content"]["application/problem+json"]["schema"] == {"$ref": PROBLEM_REF}
    assert "credits" in refused["description"]


def test_no_402_where_no_credits_apply(demo):
    Rule.objects.filter(name="prepaid-credits").delete()
    responses = spectacular_schema()["paths"]["/api/items/"]["get"]["responses"]
    assert "402" not in responses and "429" in responses


def test_a_rule_that_fails_closed_is_named_with_its_problem_type(demo):
    Rule.objects.create(name="search-closed", plan=None, scope="ip", endpoint="api:search",
                        rate=10, period_s=60, burst=10, on_redis_failure="closed")
    paths = spectacular_schema()["paths"]
    closed = paths["/api/search/"]["get"]["responses"]["429"]
    assert "search-closed refuse requests then" in closed["description"]
    examples = closed["content"]["application/problem+json"]["examples"]
    assert examples["temporary-reduced-capacity"]["value"]["type"].endswith(
        "#temporary-reduced-capacity")
    other = paths["/api/items/"]["get"]["responses"]["429"]
    assert "temporary-reduced-capacity" not in other["content"]["application/problem+json"][
        "examples"]


def test_a_fail_closed_refusal_is_documented_with_the_status_it_is_answered_with(
        demo, settings, server_executable):
    # the issue asked for 503 there; the limiter answers a fail-closed refusal 429 (problem type
    # temporary-reduced-capacity), so that is what the schema documents, and no 503
    for endpoint in ("ninja:list_items", "api:items"):
        Rule.objects.create(name=f"closed-{endpoint[:5]}", plan=None, scope="ip",
                            endpoint=endpoint, rate=10, period_s=60, burst=10,
                            on_redis_failure="closed")
    server = RedisServer(executable=server_executable).start()  # this test's own, stopped below
    try:
        settings.CACHES = caches_for(server.url)  # a new Limiter on that server
        documented = {"/ninja/items": ninja_schema()["paths"]["/ninja/items"]["get"],
                      "/api/items/": spectacular_schema()["paths"]["/api/items/"]["get"]}
        for path, operation in documented.items():
            assert "503" not in operation["responses"], path
            refused = operation["responses"]["429"]
            assert "closed-" in refused["description"] and "refuse requests then" in \
                refused["description"], path
            examples = refused["content"]["application/problem+json"]["examples"]
            assert "temporary-reduced-capacity" in examples, path
            assert Client().get(path).status_code == 200  # rules compiled, Redis answering
        server.stop()
        for path, operation in documented.items():
            response = Client().get(path)
            assert str(response.status_code) == "429" and "429" in operation["responses"], path
            body = json.loads(response.content)
            assert body["type"] == TEMPORARY_REDUCED_CAPACITY, path
            assert body["status"] == 429 and body["violated-policies"][0].startswith("closed-")
    finally:
        server.stop()


def test_views_the_limiter_does_not_decide_are_left_alone(demo, settings, monkeypatch):
    from project.demo.views import ItemList

    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EXEMPT_PATHS": ["/ninja-parts/"]}
    monkeypatch.setattr(ItemList, "throttle_classes", [])
    paths = spectacular_schema()["paths"]
    assert "429" not in paths["/api/items/"]["get"]["responses"]  # no QuotaThrottle
    assert "x-ratelimit-cost" not in paths["/api/items/"]["get"]
    assert "429" in paths["/api/search/"]["get"]["responses"]
    # an exempt path: QuotaMiddleware skips it, only QuotaThrottle limits there
    paths = ninja_schema("ninja-parts")["paths"]
    assert "429" not in paths["/ninja-parts/middleware"]["get"]["responses"]
    assert "429" in paths["/ninja-parts/operation"]["get"]["responses"]


def test_operations_marked_exempt_document_no_limit(demo):
    # @ratelimit_exempt on the operation: neither QuotaThrottle nor QuotaMiddleware decides it
    for prefix, path in (("ninja", "/ninja/health"), ("ninja", "/ninja/async-health"),
                         ("ninja-parts", "/ninja-parts/exempt"),
                         ("ninja-parts", "/ninja-parts/exempt-throttled")):
        operation = ninja_schema(prefix)["paths"][path]["get"]
        assert "429" not in operation["responses"] and "x-ratelimit-cost" not in operation, path
    assert "429" in ninja_schema()["paths"]["/ninja/keyed"]["get"]["responses"]


# --- Django Ninja ------------------------------------------------------------------------------

def test_every_ninja_operation_documents_its_429_and_its_cost(demo):
    EndpointCost.objects.create(endpoint="ninja:create_item", method="POST", cost=7)
    schema = ninja_schema()
    items = schema["paths"]["/ninja/items"]
    assert_documents_a_refusal(items["get"])
    assert_documents_a_refusal(items["post"])
    assert items["get"]["x-ratelimit-cost"] == dict.fromkeys(PLANS, 1)
    assert items["post"]["x-ratelimit-cost"] == dict.fromkeys(PLANS, 7)
    assert_documents_a_refusal(schema["paths"]["/ninja/async-keyed"]["get"])
    assert "RateLimitProblem" in schema["components"]["schemas"]
    assert set(schema["components"]["headers"]) == {"RateLimit", "RateLimit-Policy",
                                                    "Retry-After"}


def test_ninja_operations_the_middleware_decides_are_documented_only_with_it(demo, settings):
    paths = ninja_schema("ninja-parts")["paths"]
    assert "429" in paths["/ninja-parts/middleware"]["get"]["responses"]
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "QuotaMiddleware" not in m]
    paths = ninja_schema("ninja-parts")["paths"]
    assert "429" not in paths["/ninja-parts/middleware"]["get"]["responses"]
    assert "429" in paths["/ninja-parts/router/routed"]["get"]["responses"]
    assert "429" in paths["/ninja-parts/operation"]["get"]["responses"]


def test_a_metered_ninja_cost_is_marked_as_an_estimate(demo):
    EndpointCost.objects.create(endpoint="ninja:list_items", method="GET", cost=10,
                                metered=True, minimum=1)
    operation = ninja_schema()["paths"]["/ninja/items"]["get"]
    assert operation["x-ratelimit-cost"] == dict.fromkeys(PLANS, 10)
    assert operation["x-ratelimit-metered"] == dict.fromkeys(PLANS, 1)
