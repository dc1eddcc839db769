"""The alerts admin in Debian's Chromium: a webhook endpoint added with its secret shown once, and
the deliveries list (status, attempts, last error) with its re-send action.

Screenshots go to ``screenshots/`` (git-ignored) for a person to look at.
"""

import pytest

from ratelimit_app.business.alerts.crossings import Crossing, store_crossings
from ratelimit_app.business.alerts.models import Event, WebhookDelivery, WebhookEndpoint
from ratelimit_app.models import Rule
from tests.helpers import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]


def test_an_endpoint_is_added_with_its_secret_shown_once(signed_in_page):
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_alerts/webhookendpoint/add/")
    # every event is ticked for a new endpoint
    assert page.locator("input[name=events]:checked").count() == len(Event.values)
    page.fill("#id_name", "billing")
    page.fill("#id_url", "not a url")
    page.click("input[name=_save]")
    assert "Enter a valid URL." in page.locator(".errorlist").first.inner_text()
    page.fill("#id_url", "https://billing.example.com/hooks/quota")
    for event in Event.values:  # every event but quota.exhausted
        if event != "quota.exhausted":
            page.uncheck(f"input[name=events][value='{event}']")
    page.click("input[name=_save]")

    endpoint = WebhookEndpoint.objects.get(name="billing")
    assert endpoint.event_list() == ["quota.exhausted"]
    shown = page.locator("#new-webhook-secret").inner_text()
    assert shown == endpoint.secret and shown.startswith("whsec_") and len(shown) > 40
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "webhook-endpoint-created.png"), full_page=True)

    page.click("text=Edit this endpoint")
    page.wait_for_selector("#id_url")
    assert endpoint.secret not in page.content()  # never shown again
    page.goto(f"{page.base}/admin/ratelimit_alerts/webhookendpoint/")
    assert endpoint.secret not in page.content()

    # a lost secret is replaced, and the new one shown once
    page.locator("#result_list input.action-select").first.check()
    page.select_option("select[name=action]", "rotate_secret")
    page.click("button[name=index]")
    rotated = page.locator("#new-webhook-secret").inner_text()
    endpoint.refresh_from_db()
    assert rotated == endpoint.secret and rotated != shown
    assert "was replaced" in page.locator(".messagelist").inner_text()
    page.goto(f"{page.base}/admin/ratelimit_alerts/webhookendpoint/")
    assert rotated not in page.content()
    assert page.problems == []


def test_the_deliveries_list_shows_failures_and_resends_them(signed_in_page):
    page = signed_in_page
    rule = Rule.objects.create(name="monthly", scope="user", kind="calendar",
                               calendar_period="month", rate=1000, period_s=31 * 86400,
                               burst=1000, alert_thresholds="100")
    WebhookEndpoint.objects.update(enabled=False)  # the demo's receiver: not this test's
    WebhookEndpoint.objects.create(name="billing", url="https://billing.example.com/hooks")
    store_crossings([Crossing(rule.id, "rl:{key.abc}", "key:1 (key rk_ab12…)", 100,
                              1_700_000_000_000, 1000, 1000)])
    WebhookDelivery.objects.update(status="failed", attempts=9,
                                   last_error="ConnectionRefusedError: [Errno 111] refused")

    page.goto(f"{page.base}/admin/ratelimit_alerts/webhookdelivery/")
    row = page.locator("#result_list tbody tr").first
    text = row.inner_text()
    assert "Failed (gave up)" in text and "quota.exhausted" in text and "billing" in text
    assert "[Errno 111] refused" in text and "Failed (gave up), 9 attempts" in text
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", "resend_deliveries")
    page.click("button[name=index]")
    assert "1 delivery queued to be sent again" in page.locator(".messagelist").inner_text()
    assert "Pending, 9 attempts" in page.locator("#result_list tbody tr").first.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "webhook-deliveries.png"), full_page=True)
    # every column fits beside the sidebar at 1280 px (nothing scrolled out of sight)
    assert page.evaluate("(() => { const r = document.querySelector('.results');"
                         " return r.scrollWidth <= r.clientWidth; })()")
    assert WebhookDelivery.objects.get().status == "pending"

    # the alert itself, listed read-only
    page.goto(f"{page.base}/admin/ratelimit_alerts/quotaalert/")
    assert "key:1 (key rk_ab12…)" in page.locator("#result_list").inner_text()
    assert page.problems == []
