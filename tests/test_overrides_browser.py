"""Dated overrides in Debian's Chromium: the admin's list says which are scheduled, active and
expired (and filters them), and the dashboard's panel shows who is on one now."""

import datetime

import pytest
from django.utils import timezone

from ratelimit_app.models import IdentityOverride, Rule
from tests.test_admin_browser import (  # noqa: F401  (fixtures)
    SCREENSHOTS,
    _orm_beside_playwright,
    base_url,
    signed_in_page,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def dated_overrides():
    """Overrides of four IPs: one active until tomorrow, one scheduled, one expired, one
    permanent."""
    now = timezone.now()
    day = datetime.timedelta(days=1)
    rule = Rule.objects.get(name="free-ip")
    for ip, starts_at, ends_at, reason in (
        ("198.51.100.1", now - day, now + day, "launch week"),
        ("198.51.100.2", now + day, now + 2 * day, "next campaign"),
        ("198.51.100.3", now - 2 * day, now - day, "last sale"),
    ):
        IdentityOverride.objects.create(ip=ip, rule=rule, rate=50, period_s=60, burst=100,
                                        starts_at=starts_at, ends_at=ends_at, reason=reason)
    IdentityOverride.objects.create(ip="198.51.100.4", exempt=True, note="monitoring")


def schedules(page):
    """Return {IP: schedule state} of the override list's rows on the page."""
    found = {}
    for row in page.locator("#result_list tbody tr").all():
        cell = row.locator(".ratelimit-schedule")
        found[row.locator("th").inner_text().split(":")[0]] = cell.get_attribute("data-schedule")
    return found


def test_the_admin_lists_dated_overrides_and_the_dashboard_shows_the_active_one(
        signed_in_page):
    page = signed_in_page
    dated_overrides()
    page.goto(f"{page.base}/admin/ratelimit_app/identityoverride/")
    listed = schedules(page)
    assert listed["198.51.100.1"] == "active"
    assert listed["198.51.100.2"] == "scheduled"
    assert listed["198.51.100.3"] == "expired"
    assert listed["198.51.100.4"] == "permanent"
    assert page.get_by_text("launch week").count() == 1
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "overrides-list.png"), full_page=True)

    for state, ip in (("active", "198.51.100.1"), ("scheduled", "198.51.100.2"),
                      ("expired", "198.51.100.3"), ("permanent", "198.51.100.4")):
        page.click(f"#changelist-filter a[href*='schedule={state}']")
        page.wait_for_url(f"**schedule={state}")
        page.wait_for_load_state()
        assert list(schedules(page)) == [ip], state

    page.goto(f"{page.base}/admin/ratelimit_app/dashboard/")
    rows = page.locator("[data-table=temporary] tbody tr")
    assert rows.count() == 1
    text = rows.first.inner_text()
    assert "198.51.100.1" in text and "free-ip" in text and "launch week" in text
    until = timezone.localtime(IdentityOverride.objects.get(ip="198.51.100.1").ends_at)
    assert until.strftime("%Y-%m-%d %H:%M") in text
    page.screenshot(path=str(SCREENSHOTS / "dashboard-temporary.png"), full_page=True)
    assert page.problems == []
