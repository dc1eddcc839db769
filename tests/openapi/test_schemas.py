"""The limits in the OpenAPI schemas (ratelimit_app/openapi/): drf-spectacular's, through the
postprocessing hook, and Django Ninja's, through RateLimitedOpenAPI: 429 (402 where credits
apply) with the problem schema and the rate-limit headers, costs per plan from the
EndpointCost rows, fail-closed rules named, only the plans OPENAPI_PLANS lets a schema name;
each refusal documented under the media type a real refusal is served as. The demo's DRF views
and the Ninja APIs of tests/adapters/ninja_api.py, the demo's rules and costs."""

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
    # every plan named: the tests below read each plan's cost (the default: test_plans_named)
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "OPENAPI_PLANS": "all"}
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


def assert_documents_a_refusal(operation, media_type="application/problem+json"):
    refused = operation["responses"]["429"]
    assert list(refused["content"]) == [media_type]
    assert refused["content"][media_type]["schema"] == {"$ref": PROBLEM_REF}
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
        # (DRF's QuotaThrottle refuses: DRF renders the problem as its JSONRenderer does)
        assert_documents_a_refusal(schema["paths"][path][method], "application/json")
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
    responses = spectacular_schema()["paths"]["/api/items/"]["get"]["responses"]
    refused = responses["402"]
    assert refused["content"]["application/json"]["schema"] == {"$ref": PROBLEM_REF}
    assert "Refused by prepaid credits (prepaid-credits)" in refused["description"]
    # the credits rule refuses with 402, never with the 429 that lists the quotas
    assert "prepaid-credits" not in responses["429"]["description"]
    assert "free-ip" in responses["429"]["description"]


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
    examples = closed["content"]["application/json"]["examples"]
    assert examples["temporary-reduced-capacity"]["value"]["type"].endswith(
        "#temporary-reduced-capacity")
    other = paths["/api/items/"]["get"]["responses"]["429"]
    assert "temporary-reduced-capacity" not in other["content"]["application/json"][
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
            [content] = refused["content"].values()
            assert "temporary-reduced-capacity" in content["examples"], path
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


# --- what a schema may name: OPENAPI_PLANS -----------------------------------------------------

def test_by_default_a_schema_names_only_the_default_plans_and_their_rules(demo, settings):
    config = dict(settings.RATELIMIT_APP)
    config.pop("OPENAPI_PLANS")  # the default
    settings.RATELIMIT_APP = config
    Rule.objects.create(name="acme-corp-closed", plan=Plan.objects.get(slug="enterprise"),
                        scope="user", rate=10, period_s=60, burst=10, on_redis_failure="closed")
    for operation in (spectacular_schema()["paths"]["/api/items/"]["get"],
                      ninja_schema()["paths"]["/ninja/items"]["get"]):
        assert operation["x-ratelimit-cost"] == {"free": 1}  # the demo's default plan
        text = json.dumps(operation)
        for hidden in ("enterprise", '"pro"', "pro-user", "studio", "prepaid",
                       "acme-corp-closed"):
            assert hidden not in text, hidden
        assert "402" not in operation["responses"]  # credits apply on an unnamed plan only
        description = operation["responses"]["429"]["description"]
        assert "free-ip" in description and "global" in description


@pytest.mark.parametrize("named, costs, shown, hidden", [
    (["pro", "no-such-plan"], {"pro": 5}, "pro-user", "free-ip"),
    ([], None, "global", "free-ip"),  # the rules for every plan only
])
def test_a_list_of_plans_names_those_only(demo, settings, named, costs, shown, hidden):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "OPENAPI_PLANS": named}
    for operation in (spectacular_schema()["paths"]["/api/search/"]["get"],
                      ninja_schema()["paths"]["/ninja/items"]["get"]):
        assert operation.get("x-ratelimit-cost", {}).keys() == (costs or {}).keys()
        description = operation["responses"]["429"]["description"]
        assert shown in description and hidden not in description
    assert spectacular_schema()["paths"]["/api/search/"]["get"].get("x-ratelimit-cost") == costs


def test_a_setting_that_names_no_plan_list_is_a_system_check_error(demo, settings):
    from django.core.checks import run_checks

    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "OPENAPI_PLANS": "pro"}
    [error] = [e for e in run_checks() if e.id == "ratelimit_app.E014"]
    assert "'pro'" in error.msg and "list of plan slugs" in error.hint
    operation = spectacular_schema()["paths"]["/api/items/"]["get"]
    assert "x-ratelimit-cost" not in operation and "429" in operation["responses"]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "OPENAPI_PLANS": ["pro"]}
    assert not [e for e in run_checks() if e.id == "ratelimit_app.E014"]


# --- the documented refusal is the one served --------------------------------------------------

def documented_refusal(operation, content_type):
    """The schema's 429 content for ``content_type`` (a real response's, parameters left out)
    and the problem schema's properties and required fields."""
    content = operation["responses"]["429"]["content"]
    media_type = content_type.split(";")[0].strip()
    assert media_type in content, (content_type, list(content))
    return media_type


def refuse(path):
    """Ask ``path`` until it is refused; return the 429."""
    client = Client()
    for _ in range(3):
        response = client.get(path)
        if response.status_code == 429:
            return response
    raise AssertionError(f"{path} was never refused")


@pytest.mark.parametrize("middleware_decides_drf", [False, True])
def test_a_refusal_is_served_as_the_schema_documents_it(demo, settings, middleware_decides_drf):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP,
                              "MIDDLEWARE_INCLUDES_DRF": middleware_decides_drf}
    for endpoint in ("api:items", "ninja:list_items"):
        Rule.objects.create(name=f"tight-{endpoint[:5]}", plan=None, scope="ip",
                            endpoint=endpoint, rate=1, period_s=3600, burst=1)
    schema = spectacular_schema()
    problem = schema["components"]["schemas"]["RateLimitProblem"]
    served = {"/api/items/": (schema["paths"]["/api/items/"]["get"], refuse("/api/items/")),
              "/ninja/items": (ninja_schema()["paths"]["/ninja/items"]["get"],
                               refuse("/ninja/items"))}
    for path, (operation, response) in served.items():
        media_type = documented_refusal(operation, response["Content-Type"])
        body = json.loads(response.content)
        assert set(problem["required"]) <= set(body) <= set(problem["properties"]), path
        assert body["status"] in problem["properties"]["status"]["enum"]
        assert {"RateLimit", "RateLimit-Policy", "Retry-After"} <= set(response.headers)
        if path == "/api/items/":
            expected = "application/problem+json" if middleware_decides_drf \
                else "application/json"
            assert media_type == expected
        else:
            assert media_type == "application/problem+json"
