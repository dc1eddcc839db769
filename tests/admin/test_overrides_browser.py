"""Dated overrides and the audit trail in Debian's Chromium: the admin's list says which
overrides are scheduled, active and expired (and filters them), the dashboard's panel shows who
is on one now, and an entry of the audit trail is restored through its dry-run page."""

import datetime

import pytest
from django.utils import timezone

from ratelimit_app.models import ApiKey, AuditEntry, IdentityOverride, Rule
from tests.helpers import SCREENSHOTS
from tests.config.test_overrides import keys_with_dated_plans

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]


def without_the_demos_override():
    """Remove the demo's own dated override (dana's launch week): these tests count theirs."""
    IdentityOverride.objects.filter(user__username="dana").delete()


def dated_overrides():
    """Overrides of four IPs: one active until tomorrow, one scheduled, one expired, one
    permanent."""
    without_the_demos_override()
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
    IdentityOverride.objects.create(ip="198.51.100.4", exempt=True, reason="monitoring")


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
    page.goto(f"{page.base}/admin/ratelimit_callers/identityoverride/")
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

    page.goto(f"{page.base}/admin/ratelimit_monitoring/dashboard/")
    rows = page.locator("[data-table=temporary] tbody tr")
    assert rows.count() == 1
    text = rows.first.inner_text()
    assert "198.51.100.1" in text and "free-ip" in text and "launch week" in text
    until = timezone.localtime(IdentityOverride.objects.get(ip="198.51.100.1").ends_at)
    assert until.strftime("%Y-%m-%d %H:%M") in text
    page.screenshot(path=str(SCREENSHOTS / "dashboard-temporary.png"), full_page=True)
    assert page.problems == []


def test_the_admin_lists_keys_by_the_schedule_of_their_plan_and_the_dashboard_the_active_one(
        signed_in_page):
    page = signed_in_page
    without_the_demos_override()
    keys_with_dated_plans()
    page.goto(f"{page.base}/admin/ratelimit_callers/apikey/")
    listed = {}
    for row in page.locator("#result_list tbody tr").all():
        schedules = row.locator(".ratelimit-schedule")  # none: no plan of its own
        listed[row.locator("td.field-name").inner_text()] = \
            schedules.get_attribute("data-schedule") if schedules.count() else None
    assert listed == {"active": "active", "scheduled": "scheduled", "expired": "expired",
                      "permanent": "permanent", "demo": None}
    page.screenshot(path=str(SCREENSHOTS / "api-keys-plan-schedule.png"), full_page=True)

    page.goto(f"{page.base}/admin/ratelimit_monitoring/dashboard/")
    rows = page.locator("[data-table=temporary] tbody tr")
    assert rows.count() == 1
    text = rows.first.inner_text()
    assert "rk_activ" in text and "acme" in text and "plan Pro" in text
    assert "active trial" in text
    until = timezone.localtime(ApiKey.objects.get(name="active").ends_at)
    assert until.strftime("%Y-%m-%d %H:%M") in text
    assert page.problems == []


def test_a_rule_edited_in_the_admin_is_restored_from_the_audit_trail(signed_in_page):
    """Edit a rule, then restore the entry before the edit: the dry-run page lists the change,
    the confirmation applies it, and the rule's numbers are back."""
    page = signed_in_page
    rule = Rule.objects.get(name="free-user")
    before = AuditEntry.objects.order_by("-id").first()
    page.goto(f"{page.base}/admin/ratelimit_app/rule/{rule.pk}/change/")
    page.fill("#id_burst", str(rule.burst + 5))
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    assert Rule.objects.get(pk=rule.pk).burst == rule.burst + 5
    edit = AuditEntry.objects.order_by("-id").first()
    assert edit.actor == "admin" and edit.summary == (
        f"rule “free-user”: burst {rule.burst} → {rule.burst + 5}")

    # the rule's own history, from its change page
    page.goto(f"{page.base}/admin/ratelimit_app/rule/{rule.pk}/change/")
    page.click("a.ratelimit-audit-history")
    page.wait_for_url("**/auditentry/?touched=*")
    assert page.locator("#result_list tbody tr").first.inner_text().count(edit.summary) == 1

    page.goto(f"{page.base}/admin/ratelimit_monitoring/auditentry/")
    # the list counts its entries (its plural was once "audit trail": "2 audit trail"); the
    # paginator is a <p> before Django 6.0 and a <nav> since
    count = AuditEntry.objects.count()
    assert page.locator(".paginator").inner_text().strip().endswith(f"{count} audit entries")
    row = page.locator("#result_list tbody tr",
                       has=page.locator(f"a[href$='/{before.pk}/change/']"))
    row.locator("a.ratelimit-restore").click()
    page.wait_for_selector("[data-restore=diff]")
    diff = page.locator("[data-restore=diff]").inner_text()
    assert "~ rule “free-user”" in diff and f"burst: {rule.burst + 5} → {rule.burst}" in diff
    page.screenshot(path=str(SCREENSHOTS / "audit-restore-dry-run.png"), full_page=True)
    assert Rule.objects.get(pk=rule.pk).burst == rule.burst + 5  # nothing changed yet

    page.click("input[type=submit][value=Restore]")
    page.wait_for_selector(".messagelist .success")
    assert f"Restored the configuration of entry #{before.pk}" in page.inner_text(".messagelist")
    page.goto(f"{page.base}/admin/ratelimit_app/rule/{rule.pk}/change/")
    assert page.input_value("#id_burst") == str(rule.burst)
    restored = AuditEntry.objects.order_by("-id").first()
    assert restored.source == "restore" and restored.restored_from == before
    assert page.problems == []
