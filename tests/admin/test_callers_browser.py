"""The caller's page in Debian's Chromium, counting page loads from the admin index: find a
caller and see why it is refused; lift a ban and top up credits from its page."""

import time

import pytest
from django.test import Client
from playwright.sync_api import expect

from ratelimit_app.models import ApiKey, Ban, BanRule

from ..helpers import SCREENSHOTS, limiter, use_fake_clock

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]

SCRAPER = "203.0.113.77"


def count_loads(page):
    """Return a list that gets one entry per page the browser loads from now on."""
    loads = []
    page.on("load", lambda loaded: loads.append(loaded.url))
    return loads


def test_find_a_caller_from_the_index_and_see_why_it_is_refused(signed_in_page):
    page = signed_in_page
    # the clock stands still: the drained bucket does not refill while the pages load
    use_fake_clock(now_ms=int(time.time() * 1000))
    api = Client()
    statuses = [api.get("/api/items/", HTTP_X_API_KEY="rk_alice_free").status_code
                for _ in range(32)]
    assert statuses.count(429) == 2  # free-user: bursts up to 30
    limiter().flusher.flush_now()
    page.goto(f"{page.base}/admin/")
    loads = count_loads(page)
    with page.expect_navigation():
        page.get_by_role("link", name="Dashboard", exact=True).first.click()
    page.fill("#rl-q", "rk_alice")
    with page.expect_navigation():
        page.press("#rl-q", "Enter")
    refusing = page.locator("[data-refusing]")
    expect(refusing).to_contain_text("Refused now by free-user")
    expect(refusing).to_contain_text("60 requests per minute per user or API key")
    row = page.locator('[data-table="limits"] tr[data-rule="free-user"]')
    expect(row).to_have_attribute("data-state", "empty: refusing now")
    expect(page.locator('[data-table="refused-by"] tr[data-rule="free-user"]')).to_contain_text("2")
    expect(page.locator("[data-plan-source]")).to_have_attribute("data-plan-source", "assignment")
    assert len(loads) <= 3, loads  # the dashboard, then the caller's page (a redirect: one load)
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "caller-page.png"), full_page=True)
    assert page.problems == []


def test_lift_a_ban_from_the_callers_page(signed_in_page):
    page = signed_in_page
    BanRule.objects.create(name="scrapers", scope="ip", events="statuses", statuses="404",
                           threshold=3, window_s=60, ban_s=600)
    limiter().policies.reset()
    scraper = Client(REMOTE_ADDR=SCRAPER)
    for index in range(3):
        scraper.get(f"/missing-{index}/")
    assert scraper.get("/hello/").status_code == 429
    limiter().protection.ban_log.drain()  # what its thread does, off in tests
    ban = Ban.objects.get()
    page.goto(f"{page.base}/admin/ratelimit_monitoring/dashboard/callers/?q={SCRAPER}")
    row = page.locator(f'[data-table="bans"] tr[data-ban="{ban.pk}"]')
    expect(row).to_contain_text("scrapers")
    with page.expect_navigation():
        row.get_by_role("button", name="Lift").click()
    expect(page.locator(".messagelist")).to_contain_text(f"Lifted the ban of {SCRAPER}")
    expect(page.locator('[data-table="bans"]')).to_contain_text("No ban in force.")
    assert scraper.get("/hello/").status_code == 200  # the next request is allowed
    ban.refresh_from_db()
    assert ban.lifted_by == "admin"
    assert page.problems == []


def test_top_up_from_the_callers_page(signed_in_page):
    page = signed_in_page
    erin = ApiKey.objects.get(user__username="erin")  # the demo's prepaid key, 100 units
    page.goto(f"{page.base}/admin/ratelimit_monitoring/dashboard/callers/?q=key%3A{erin.pk}")
    account = page.locator(f'[data-table="credits"] tr[data-account="key:{erin.pk}"]')
    before = int(account.locator("[data-prepaid-left]").inner_text().split()[0])
    with page.expect_navigation():
        account.get_by_role("link", name="Top up").click()
    page.fill("#id_units", "250")
    with page.expect_navigation():
        page.click("#credit-top-up-form input[type=submit]")
    # back on the caller's page, the balance raised
    expect(page.locator("[data-identity]")).to_have_attribute("data-identity", f"key:{erin.pk}")
    expect(page.locator(".messagelist")).to_contain_text("Credited 250 units")
    after = account.locator("[data-prepaid-left]").inner_text().split()[0]
    assert int(after) == before + 250
    assert page.problems == []
