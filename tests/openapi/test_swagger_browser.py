"""Swagger UI shows the limits: drf-spectacular's SpectacularSwaggerView and Django Ninja's
/docs, in Debian's Chromium, served by a real gunicorn (tests.openapi.settings) whose Swagger
UI files come from the server itself (drf-spectacular-sidecar's, Ninja's own static files):
no request leaves 127.0.0.1."""

import os
import shutil

import pytest

pytest.importorskip("ninja")
pytest.importorskip("drf_spectacular_sidecar")

from ..asgi_server import Gunicorn, load_demo  # noqa: E402
from ..helpers import SCREENSHOTS  # noqa: E402

pytestmark = [pytest.mark.browser]

COST_ROWS = """
import django
django.setup()
from ratelimit_app.models import EndpointCost, Plan
EndpointCost.objects.create(endpoint="ninja:list_items", method="GET",
                            plan=Plan.objects.get(slug="pro"), cost=3)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis_server, database_env):
    workdir = tmp_path_factory.mktemp("swagger")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.openapi.settings",
           **database_env(workdir), "REDIS_URL": redis_server.url, "DJANGO_DEBUG": "1"}
    load_demo(env, COST_ROWS)
    running = Gunicorn(env, workdir, workers=1).start()
    yield running
    running.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def watched(page, server):
    """Collect on ``page`` every request to another host and every failed response."""
    page.problems = []
    origin = server.url("")
    page.on("request", lambda r: not r.url.startswith((origin, "data:"))
            and page.problems.append(f"left the server: {r.url}"))
    page.on("response", lambda r: r.status >= 400 and not r.url.endswith("/favicon.ico")
            and page.problems.append(f"{r.status} {r.url}"))
    return page


def opened_operation(page, method, path):
    block = page.locator(f".opblock-{method}").filter(
        has=page.locator(f'.opblock-summary-path[data-path="{path}"]'))
    block.locator(".opblock-summary").click()
    block.locator(".responses-table").first.wait_for()
    return block


def assert_shows_the_limits(block, costs, media_type):
    text = block.inner_text()
    for shown in ("429", media_type, "RateLimit-Policy", "Retry-After",
                  "x-ratelimit-cost", *costs):
        assert shown in text, f"{shown!r} not shown"
    assert block.locator('tr.response[data-code="429"]').count() == 1


def test_drf_spectacular_swagger_ui_shows_the_429_headers_and_costs(page, server):
    watched(page, server).goto(server.url("/schema/swagger/"))
    block = opened_operation(page, "get", "/api/search/")
    # (DRF renders QuotaThrottle's refusal with the view's JSONRenderer)
    assert_shows_the_limits(block, ['"free"', "5"], "application/json")
    assert block.locator('tr.response[data-code="402"]').count() == 1  # the prepaid plan
    assert page.problems == []
    SCREENSHOTS.mkdir(exist_ok=True)
    block.screenshot(path=str(SCREENSHOTS / "swagger-drf-spectacular-limits.png"))


def test_ninja_docs_show_the_429_headers_and_costs(page, server):
    watched(page, server).goto(server.url("/ninja/docs"))
    block = opened_operation(page, "get", "/ninja/items")
    assert_shows_the_limits(block, ['"pro"', "3"], "application/problem+json")
    assert page.problems == []
    SCREENSHOTS.mkdir(exist_ok=True)
    block.screenshot(path=str(SCREENSHOTS / "swagger-ninja-limits.png"))
