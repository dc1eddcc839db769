"""The dashboard in headless Debian Chromium (Playwright) against pytest-django's live server,
and the admin pages the demo traffic fills: quota alerts, webhook deliveries, what the demo's
receiver got.

Traffic comes from the ``ratelimit_traffic`` command sent to the live server over HTTP, so it
crosses the real middleware and throttle; the test flushes the metrics itself (no sleeps).
Screenshots go to the git-ignored ``screenshots/`` folder.
"""

import io

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

import ratelimit_app.admin.dashboard.admin  # noqa: F401  (registers the dashboard with the admin)
from ratelimit_app.decision.keys import scope_token
from ratelimit_app.models import QuotaAlert

from ..helpers import SCREENSHOTS, breadcrumbs_of, limiter, poll_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]

DASHBOARD = "/admin/ratelimit_monitoring/dashboard/"
TIMEOUT_MS = 15_000


def send_traffic(live_server, requests):
    call_command("ratelimit_traffic", url=live_server.url, requests=requests, rps=0,
                 duration=60, stdout=io.StringIO())
    limiter().flusher.flush_now()


@pytest.fixture
def dashboard(live_server, page, settings):
    """A signed-in admin on the dashboard after demo traffic; returns (page, console errors)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "DASHBOARD_REFRESH_S": 1}
    # the webhook endpoint at this server's receiver
    call_command("load_demo", server_url=live_server.url, stdout=io.StringIO())
    send_traffic(live_server, 120)
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{live_server.url}/admin/login/?next={DASHBOARD}")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{DASHBOARD}")
    # Collected from here on (the login page has its own test in test_admin_browser.py).
    errors = []
    page.on("console", lambda message: errors.append(message.text)
            if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda response: errors.append(f"{response.status} {response.url}")
            if response.status >= 400 else None)
    page.reload()
    SCREENSHOTS.mkdir(exist_ok=True)
    # (the page's live refresh stops with its browser context, and conftest's
    # _live_server_idle_before_flush waits for a refresh being served before the flush)
    return page, errors


def test_dashboard_shows_real_data_without_console_errors(dashboard):
    page, errors = dashboard
    bars = page.locator(".rl-chart .rl-bar")
    # the minutes since the traffic began (a minute or two here), at least the last 15
    expect(bars).not_to_have_count(0)
    assert 15 <= bars.count() <= 17
    allowed = sum(int(v) for v in bars.evaluate_all("els => els.map(e => e.dataset.allowed)"))
    denied = sum(int(v) for v in bars.evaluate_all("els => els.map(e => e.dataset.denied)"))
    assert allowed + denied == 120 and denied > 0
    expect(page.locator('[data-stat="requests"]')).to_have_text("120")
    top = page.locator('[data-table="callers"] tbody tr').first
    expect(top.locator(".rl-identity")).to_have_text("127.0.0.1")  # the anonymous scraper
    expect(page.get_by_text("Requests per minute", exact=True)).to_be_visible()
    page.screenshot(path=str(SCREENSHOTS / "dashboard-light.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(SCREENSHOTS / "dashboard-dark.png"), full_page=True)
    assert errors == []


# Where each essential of the first screen ends, in CSS px from the top of the page.
ESSENTIALS_BOTTOM = """() => Object.fromEntries(
  ['[data-health-line]', '.rl-rate-chart', '[data-table^="rate-"]', '[data-table="callers"]',
   '[data-table="bans"]'].map(selector => {
    const element = [...document.querySelectorAll(selector)].find(e => e.offsetParent !== null);
    return [selector, element ? element.getBoundingClientRect().bottom + window.scrollY : null];
  }))"""


def test_the_essentials_fill_the_first_screen_in_light_and_dark(dashboard):
    """At 1280 × 800: the health line, the 429-rate chart and its table (per plan or rule, over
    the last hour or day, as chosen), the hottest callers and the bans end above y = 800, with
    no horizontal overflow; the chart's numbers are the table's."""
    page, errors = dashboard
    page.set_viewport_size({"width": 1280, "height": 800})
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for by, over in (("plan", "hour"), ("rule", "hour"), ("rule", "day"), ("plan", "day")):
            page.check(f"#rl-by-{by}")
            page.check(f"#rl-over-{over}")
            chart = page.locator(f'[data-rates-by="{by}"] .rl-rate-chart[data-range="{over}"]')
            expect(chart).to_be_visible()
            expect(page.locator(".rl-rate-chart:visible")).to_have_count(1)
            bottoms = page.evaluate(ESSENTIALS_BOTTOM)
            assert all(bottom is not None and bottom <= 800 for bottom in bottoms.values()), \
                (scheme, by, over, bottoms)
        page.check("#rl-over-hour")
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        page.screenshot(path=str(SCREENSHOTS / f"dashboard-first-screen-{scheme}.png"))
    expect(page.locator("[data-health-line]")).to_contain_text("Redis reachable")
    expect(page.locator('[data-health-field="config-line"]')).to_contain_text("up to date")
    # the demo's scraper (free plan) is refused: the free plan's dots in the last hour add up
    # to the figures of its row in the table beside the chart
    hour = page.locator('[data-rates-by="plan"] .rl-rate-chart[data-range="hour"]')
    free = hour.locator('.rl-point[data-line="free"]')
    requests = sum(int(v) for v in free.evaluate_all("els => els.map(e => e.dataset.requests)"))
    denied = sum(int(v) for v in free.evaluate_all("els => els.map(e => e.dataset.denied)"))
    assert denied > 0
    row = page.locator('[data-table="rate-plan"] tr[data-name="free"] td[data-range="hour"]')
    expect(row).to_contain_text(f"({denied} of {requests})")
    assert "429 rate per plan over the last hour" in hour.get_attribute("aria-label")
    assert errors == []


def test_a_staff_browser_on_the_admin_is_no_caller(dashboard, live_server, settings):
    """The admin's pages, its index typed without a slash and the dashboard's polling: none is
    limited or counted, so the staff user never shows up among the hottest callers (even where
    EXEMPT_PATHS does not name the admin)."""
    page, errors = dashboard
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EXEMPT_PATHS": ["/health"]}
    responses = []
    page.on("response", lambda response: responses.append(response))
    page.goto(f"{live_server.url}/admin")
    first = page.locator("#content-main a").first
    assert (first.inner_text(), first.get_attribute("href")) == ("Dashboard", DASHBOARD)
    first.click()
    page.wait_for_url(f"**{DASHBOARD}")
    expect(page.locator("[data-status]")).to_contain_text("updated")  # it polled
    page.goto(f"{live_server.url}/admin/ratelimit_app/rule/")
    assert responses and not [r.url for r in responses if "ratelimit-policy" in r.headers]
    limiter().flusher.flush_now()
    hot = limiter().reader.hot_keys("1h")
    assert "admin" not in {row["display"] for rows in hot.values() for row in rows}
    page.goto(f"{live_server.url}{DASHBOARD}")
    expect(page.locator('[data-table="callers"] tbody tr').first).to_be_visible()
    assert "admin" not in page.locator('[data-table="callers"] th[scope=row]').all_inner_texts()
    assert errors == []


def test_live_refresh_updates_numbers_without_reloading(dashboard, live_server):
    page, errors = dashboard
    counter = page.locator('[data-stat="requests"]')
    expect(counter).to_have_text("120")
    page.evaluate("window.rlNotReloaded = true")
    send_traffic(live_server, 30)
    expect(counter).to_have_text("150", timeout=TIMEOUT_MS)  # polls until the refresh lands
    assert page.evaluate("window.rlNotReloaded") is True
    expect(page.locator("[data-status]")).to_contain_text("updated")
    assert errors == []


def test_reset_from_the_callers_page_empties_its_buckets(dashboard, redis_server):
    page, errors = dashboard
    page.locator('[data-table="callers"] tbody tr').first.get_by_role("link").click()
    free_ip = page.locator('[data-table="limits"] tr[data-rule="free-ip"]')
    expect(free_ip).to_have_attribute("data-capacity", "40")
    assert int(free_ip.get_attribute("data-tokens")) < 5  # drained (refills 1 per 3 s)
    page.click("text=Reset this caller's buckets…")
    expect(page.get_by_text("Reset the buckets of")).to_be_visible()
    page.click("input[value='Yes, reset']")
    expect(page.locator(".messagelist")).to_contain_text("Reset the buckets of IP 127.0.0.1")
    expect(free_ip).to_have_attribute("data-tokens", "40")
    page.screenshot(path=str(SCREENSHOTS / "caller-after-reset.png"), full_page=True)
    token = scope_token("ip", "127.0.0.1")
    # (the proofs of the credentials used from the address stay: they limit no one, and a
    # reset must not lock a known key out of its address, see protection/failed_auth.py)
    assert [key for key in redis_server.client().keys(f"rl:{{{token}}}*")
            if b"}:p." not in key] == []
    assert errors == []


# Cards whose content does not fit them: a card wider inside than out (it scrolls: a column
# hidden behind a scrollbar), or any element sticking out of its card.
OVERFLOWING_IN_CARDS = """() => {
  const cards = [...document.querySelectorAll('#rl-dashboard .rl-card')];
  return cards.flatMap(card => {
    const box = card.getBoundingClientRect();
    const late = [...card.querySelectorAll('*')].filter(el => {
        const r = el.getBoundingClientRect();
        return r.width > 0 && (r.right > box.right + 0.5 || r.left < box.left - 0.5);
    }).map(el => el.tagName + (el.textContent || '').trim().slice(0, 30));
    const scrolls = card.scrollWidth > card.clientWidth;
    return scrolls || late.length ? [{card: card.querySelector('caption, h2, dt')?.textContent,
                                     scroll: card.scrollWidth, client: card.clientWidth,
                                     late: late.slice(0, 5)}] : [];
  });
}"""


def test_no_card_clips_its_content_at_1300_px(dashboard):
    page, errors = dashboard
    page.set_viewport_size({"width": 1300, "height": 900})
    endpoint_rows = page.locator('[data-table="endpoint"] tbody tr')
    expect(endpoint_rows.first).to_be_visible()
    assert endpoint_rows.count() >= 2  # the demo traffic's endpoints are listed
    page.screenshot(path=str(SCREENSHOTS / "dashboard-1300.png"), full_page=True)
    assert page.evaluate(OVERFLOWING_IN_CARDS) == []
    assert errors == []


def test_dashboard_and_caller_page_wear_the_admins_breadcrumbs_bar(dashboard, live_server):
    """Django 6.1 styles only <ol class="breadcrumbs"> (up to 6.0 only <div class="breadcrumbs">):
    the dashboard and a caller's page must look like a stock admin page of the running
    version."""
    page, errors = dashboard
    on_dashboard = breadcrumbs_of(page)
    assert on_dashboard["links"] == ["Home", "Rate limits · Monitoring"]
    assert on_dashboard["text"].endswith("Dashboard")
    page.locator('[data-table="callers"] tbody tr').first.get_by_role("link").click()
    expect(page.locator('[data-table="limits"]')).to_be_visible()
    in_inspector = breadcrumbs_of(page)
    assert in_inspector["links"] == ["Home", "Rate limits · Monitoring", "Dashboard"]
    assert in_inspector["text"].endswith("127.0.0.1")
    page.goto(f"{live_server.url}/admin/ratelimit_app/rule/")  # Django's own changelist
    stock = breadcrumbs_of(page)["look"]
    assert stock["background"] != "rgba(0, 0, 0, 0)" and stock["rows"] == 1
    assert on_dashboard["look"] == stock
    assert in_inspector["look"] == stock
    assert errors == []


def listed(page, url):
    """Open the admin changelist at ``url``; return its rows' texts."""
    page.goto(url)
    return page.locator("#result_list tbody tr").all_inner_texts()


def stored_alerts():
    """Store the crossings queued in this process (the live server's settles queue them; tests
    run no alert thread); return how many alerts are stored."""
    limiter().alerts.drain()
    return QuotaAlert.objects.count()


def test_the_demo_traffic_fills_the_alerts_the_deliveries_and_the_receivers_page(dashboard,
                                                                                 live_server):
    """dana's streams cross AI Studio's thresholds (needs metered costs), the app's sender
    delivers the alerts to the demo's receiver, and the admin lists each step; the launch week
    override is listed as active."""
    page, errors = dashboard
    admin = f"{live_server.url}/admin"
    poll_until(lambda: stored_alerts() == 3, what="the alerts of dana's streams")
    call_command("ratelimit", "deliver", "--once", stdout=io.StringIO())

    alerts = listed(page, f"{admin}/ratelimit_app/quotaalert/")
    assert len(alerts) == 3 and all("studio-daily" in row and "dana" in row for row in alerts)
    deliveries = listed(page, f"{admin}/ratelimit_app/webhookdelivery/")
    assert len(deliveries) == 3 and all("Sent" in row for row in deliveries)
    assert sum("quota.exhausted" in row for row in deliveries) == 1
    assert len(listed(page, f"{admin}/demo/receivedwebhook/")) == 3
    valid = page.locator("#result_list td.field-valid img")
    assert valid.evaluate_all("imgs => imgs.map(i => i.alt)") == ["True"] * 3
    page.screenshot(path=str(SCREENSHOTS / "demo-received-webhooks.png"), full_page=True)
    listed(page, f"{admin}/ratelimit_app/identityoverride/")
    launch_week = page.locator("#result_list tbody tr", has_text="launch week")
    expect(launch_week).to_have_count(1)
    assert "dana" in launch_week.inner_text()
    assert launch_week.locator(".ratelimit-schedule").get_attribute("data-schedule") == "active"
    assert errors == []
