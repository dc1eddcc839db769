"""The admin pages in Debian's Chromium: the simulator round trip and the plan page's pickers.

Screenshots go to ``screenshots/`` (git-ignored) for a person to look at.
"""

from fractions import Fraction
from pathlib import Path

import pytest

from tests.helpers import load_demo_data

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parent.parent / "screenshots"


@pytest.fixture(scope="session")
def base_url():
    """Replaces pytest-playwright's fallback ``base_url`` fixture, a plugin-object method that
    pytest 9 warns about (warnings are errors here). Pages are opened by full URL."""
    return


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright(django_db_setup):
    """Playwright's sync API runs an event loop in this thread, which Django takes for an async
    context; the database calls of these tests (and their fixtures) are plain sync code.
    Depending on django_db_setup creates the test database before Playwright starts, so it is
    also torn down after Playwright stops."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def signed_in_page(page, live_server, settings):
    """A browser page signed in to the admin of the demo data, collecting console errors."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    load_demo_data()
    page.problems = []  # console errors and failed responses (the browser's own favicon aside)
    page.on("console", lambda m: m.type == "error" and "Failed to load resource" not in m.text
            and page.problems.append(m.text))
    page.on("response", lambda r: r.status >= 400 and not r.url.endswith("/favicon.ico")
            and page.problems.append(f"{r.status} {r.url}"))
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")  # only signed-in pages have it
    page.base = live_server.url
    return page


def test_login_and_admin_pages_have_no_console_error_not_even_a_favicon(page, live_server,
                                                                         settings):
    """The admin's login page had no icon link, so the browser asked for /favicon.ico: a 404
    and a console error. Nothing is filtered here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    load_demo_data()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("requestfailed", lambda r: problems.append(f"failed {r.url}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status} {r.url}"))
    page.goto(f"{live_server.url}/admin/login/")
    assert page.locator('link[rel="icon"]').get_attribute("href") == "data:,"
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")
    for path in ("/admin/", "/admin/ratelimit_app/rule/", "/admin/ratelimit_app/apikey/add/"):
        page.goto(f"{live_server.url}{path}")
        assert page.locator('link[rel="icon"]').count() >= 1, path
    page.wait_for_load_state("networkidle")
    assert problems == []


def test_simulator_round_trip_from_the_rule_list(signed_in_page):
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_app/rule/")
    page.click("text=Simulate a request")
    page.fill("#id_user", "alice")
    page.fill("#id_ip", "203.0.113.7")
    page.select_option("#id_endpoint", "api:search")
    page.select_option("#id_method", "GET")
    page.click("input[value=Simulate]")
    page.wait_for_selector("#simulation-buckets")
    rows = page.locator("#simulation-buckets tbody tr")
    assert rows.count() == 6  # five quotas and the failed-auth gate of the address
    assert page.locator("tr[data-rule=auth-failures] td.tokens").inner_text() == "10 / 10"
    assert page.locator("tr[data-rule=free-user] td.tokens").inner_text() == "30 / 30"
    assert page.locator("tr[data-rule=free-user] td.cost").inner_text() == "5"
    assert page.locator("#verdict").inner_text().startswith("Allowed")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "admin_simulator.png", full_page=True)

    page.fill("#id_ip", "not-an-ip")
    page.click("input[value=Simulate]")
    assert page.locator(".field-ip .errorlist").inner_text() == \
        "Enter a valid IPv4 or IPv6 address."
    assert page.problems == []


def test_plan_page_offers_real_endpoints_in_its_inlines(signed_in_page):
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_app/plan/")
    page.click("#result_list a:text-is(\"Free\")")
    page.wait_for_selector("#id_rules-0-endpoint")
    options = page.eval_on_selector_all("#id_rules-0-endpoint option",
                                        "options => options.map(o => o.textContent)")
    assert "api:items — /api/items/ (Item List; GET)" in options
    assert not [o for o in options if o.startswith("admin:")]
    summaries = page.locator("td.field-summary").all_inner_texts()
    assert "20 per 60 s, burst 40" in summaries  # the free-ip rule, spelled out
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "admin_plan.png", full_page=True)
    assert page.problems == []


def rate_limit_of(url, policy):
    """GET ``url``; return ``(tokens per second, remaining)`` of ``policy`` from the RateLimit
    headers (the rate is q / w, however the headers map the bucket onto q and w)."""
    import urllib.request

    response = urllib.request.urlopen(url, timeout=10)
    found = {}
    for field in ("RateLimit-Policy", "RateLimit"):
        items = dict(item.split(";", 1) for item in response.headers[field].split(", "))
        found.update(p.split("=") for p in items[f'"{policy}"'].split(";"))
    return Fraction(int(found["q"]), int(found["w"])), int(found["r"])


def test_a_rule_edited_in_the_admin_is_enforced_without_a_restart(signed_in_page):
    """What an operator does: open the rule, change its numbers, save; the API follows."""
    page = signed_in_page
    hello = f"{page.base}/hello/"
    assert rate_limit_of(hello, "free-ip") == (Fraction(20, 60), 39)  # 20 per 60 s, burst 40

    page.goto(f"{page.base}/admin/ratelimit_app/rule/?q=free-ip")
    page.click("text=free-ip")
    page.fill("#id_rate", "30")
    page.fill("#id_burst", "20")  # the smallest burst the demo's costs allow
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")

    # the next request already sees the new rate, and the 38 tokens held are capped at 20
    assert rate_limit_of(hello, "free-ip") == (Fraction(30, 60), 19)
    page.screenshot(path=str(SCREENSHOTS / "admin_rule_saved.png"))
    assert page.problems == []
