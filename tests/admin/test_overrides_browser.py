"""Dated overrides and the audit trail in Debian's Chromium: the admin's list says which
overrides are scheduled, active and expired (and filters them), the dashboard's panel shows who
is on one now, an entry of the audit trail is restored through its dry-run page, and twice a
caller's limit for a week is given in two actions from the prefilled form."""

import datetime
import re
import urllib.request

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import expect

from ratelimit_app.models import ApiKey, AuditEntry, IdentityOverride, Rule
from tests.helpers import SCREENSHOTS, poll_until

from .test_admin_browser import policy_items
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
        listed[row.locator("td.field-name_cell").inner_text()] = \
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


def bobs_policy(page):
    """bob's request through the live server (his API key), as any client would send it:
    return the RateLimit-Policy parameters of his plan's rule."""
    request = urllib.request.Request(f"{page.base}/api/items/",
                                      headers={"X-Api-Key": "rk_bob_pro"})
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
        return policy_items(response.headers, "RateLimit-Policy")["pro-user"]


def test_twice_a_callers_limit_for_a_week_takes_three_actions_from_the_callers_page(
        signed_in_page):
    """From bob's page: Override… opens the add page prefilled (``?user=<id>``) with × 2
    chosen, so typing 7 (days by default) and Save are all that is left; the sentence says the
    result before saving, and bob's next request gets twice pro-user's numbers."""
    page = signed_in_page
    bob = User.objects.get(username="bob")
    assert bobs_policy(page) == {"q": "200", "w": "20"}  # pro-user: 600 per minute, burst 200
    page.goto(f"{page.base}/admin/ratelimit_monitoring/dashboard/callers/?q=user%3A{bob.pk}")
    actions = 0

    def act(step):
        nonlocal actions
        actions += 1
        step()

    act(lambda: page.click("a[data-action=override]"))
    expect(page).to_have_url(re.compile(rf"/identityoverride/add/\?user={bob.pk}$"))
    assert page.locator("#id_treatment input[value=factor]").is_checked()
    assert page.input_value("#id_factor") == "2"
    assert page.input_value("#id_duration_1") == "day"
    # every user, key or IP rule that applies to bob: his plan's, and the demo's trial of a
    # limit on searches per client IP (every plan)
    doubled = ("bob: 1,200 requests per minute, bursts up to 400 (pro-user); 20 requests to "
               "api:search per minute, bursts up to 20 (search-ip-trial)")
    words = page.locator("#rule-in-words")
    assert words.inner_text() == f"{doubled}, with no end"
    assert page.locator("#rule-impact").inner_text() == (
        "Now: pro-user, 600 requests per minute, bursts up to 200; search-ip-trial, 10 "
        "requests to api:search per minute, bursts up to 10.")

    act(lambda: page.fill("#id_duration_0", "7"))
    # the sentence follows what is typed (the preview endpoint), before anything is saved
    until = timezone.localtime(timezone.now() + datetime.timedelta(days=7))
    expect(words).to_contain_text(f"{doubled}, until {until.day} {until:%B}")
    assert not IdentityOverride.objects.filter(user=bob).exists()
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "override-factor-form.png"), full_page=True)
    act(lambda: page.click("input[name=_save]"))
    page.wait_for_selector(".messagelist .success")
    assert actions <= 4  # the bound, from the caller's page

    override = IdentityOverride.objects.get(user=bob)
    assert override.factor == 2 and override.rule is None
    assert override.ends_at - override.starts_at == datetime.timedelta(days=7)
    row = page.locator("#result_list tbody tr", has_text="bob")
    assert "bob: × 2 on every user, key or IP rule that applies, until" in row.inner_text()
    # the live server's next request: twice the burst, the same window
    poll_until(lambda: bobs_policy(page) == {"q": "400", "w": "20"},
               what="bob's doubled RateLimit-Policy")
    page.screenshot(path=str(SCREENSHOTS / "override-factor-list.png"), full_page=True)
    assert page.problems == []
