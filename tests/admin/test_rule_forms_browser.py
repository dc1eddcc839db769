"""The rule's forms in Debian's Chromium: the words typed into each kind's form read as the server
renders them (the same table of cases, tests/admin/rule_word_cases.py), the kind chosen and a
rule saved without JavaScript, each kind's form short (fields, words), the estimate of new
numbers, and an operator's tasks from the admin index counted in page loads."""

import datetime
import urllib.request
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone
from playwright.sync_api import expect

from ratelimit_app.config.rule_kinds import FORM_KINDS, form_kind_of
from ratelimit_app.models import ApiKey, IdentityOverride, Rule

from ..helpers import SCREENSHOTS, limiter
from .rule_word_cases import CASES

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]

ROOT = Path(__file__).resolve().parents[2]
MAX_FIELDS = 12
MAX_WORDS = 250
# The fields of the form: its visible controls (not the hidden ones, not the buttons), a
# field typed in two controls (a period's number and unit: period_s_0, period_s_1) counted once.
FIELDS_JS = """() => [...document.querySelectorAll(
    '#content form input:not([type=hidden]):not([type=submit]), #content form select,'
    + ' #content form textarea')].filter(e => e.offsetParent !== null
        || e.closest('details')).map(e => e.name.replace(/_[0-9]$/, ''))"""
WORDS_JS = "() => document.querySelector('#content').innerText.split(/\\s+/).filter(Boolean)"


def type_case(page, fields):
    """Type a case's fields into the open form, as an operator would."""
    for name, value in fields.items():
        if name == "period":
            page.fill("#id_period_s_0", value[0])
            page.select_option("#id_period_s_1", value[1])
        elif name in ("scope", "status", "endpoint", "calendar_period"):
            page.select_option(f"#id_{name}", value)
        else:
            page.fill(f"#id_{name}", value)


def test_the_words_typed_read_as_the_server_renders_them(signed_in_page):
    page = signed_in_page
    for key, fields, words in CASES:
        page.goto(f"{page.base}/admin/ratelimit_app/rule/add/?kind={key}")
        type_case(page, fields)
        expect(page.locator("#rule-in-words")).to_have_text(words)
    assert page.problems == []


def test_each_kind_form_is_short(signed_in_page):
    page = signed_in_page
    page.set_viewport_size({"width": 1280, "height": 800})
    figures = {}
    for key in FORM_KINDS:
        page.goto(f"{page.base}/admin/ratelimit_app/rule/add/?kind={key}")
        figures[key] = (len(set(page.evaluate(FIELDS_JS))), len(page.evaluate(WORDS_JS)))
    print("fields and words of each kind's form:", figures)
    assert all(fields <= MAX_FIELDS and words <= MAX_WORDS
               for fields, words in figures.values()), figures
    # and the other kinds' fields are not on the page at all
    page.goto(f"{page.base}/admin/ratelimit_app/rule/add/?kind=calendar")
    assert page.locator("#id_burst, #id_period_s_0, #id_lease").count() == 0


def test_the_kind_is_chosen_and_a_rule_saved_without_javascript(signed_in_page, browser,
                                                                 live_server):
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/ratelimit_app/rule/add/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    page.click('li[data-kind="concurrency"] a')
    assert page.locator("#id_burst").count() == 0
    page.fill("#id_name", "exports-in-flight")
    page.select_option("#id_scope", "tenant")
    page.fill("#id_rate", "5")
    page.fill("#id_period_s_0", "2")
    page.select_option("#id_period_s_1", "minute")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    rule = Rule.objects.get(name="exports-in-flight")
    assert (rule.kind, rule.rate, rule.period_s) == ("concurrency", 5, 120)
    context.close()


def get(url, **headers):
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return r.status


def test_changed_numbers_say_what_they_would_have_done_to_the_last_hour(signed_in_page):
    page = signed_in_page
    for _ in range(12):
        assert get(f"{page.base}/hello/", **{"X-Api-Key": "rk_alice_free"}) == 200
    limiter().flusher.flush_now()
    rule = Rule.objects.get(name="free-user")
    page.goto(page.base + reverse("admin:ratelimit_app_rule_change", args=[rule.pk]))
    expect(page.locator("#rule-impact")).to_have_text("")  # nothing changed yet
    page.fill("#id_rate", "1")
    page.select_option("#id_period_s_1", "hour")
    page.fill("#id_burst", "5")
    expect(page.locator("#rule-impact")).to_have_text(
        "Estimate: at least 1 of the 1 heaviest callers of the last hour would have been "
        "refused: each used more than the 6 tokens an hour the new numbers allow.")
    expect(page.locator("#rule-in-words")).to_have_text(
        "1 request per hour per user or API key, bursts up to 5; enforced")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "admin_rule_impact.png", full_page=True)
    rule.refresh_from_db()
    assert (rule.rate, rule.burst) == (60, 30)  # nothing saved: only read
    assert page.problems == []


class PageLoads:
    """Counts the documents the page loads (each navigation, a form's POST and its redirect
    counting as the pages the operator waits for)."""

    def __init__(self, page):
        self.count = 0
        page.on("load", lambda: self._loaded())

    def _loaded(self):
        self.count += 1


def test_an_operator_creates_a_plan_with_a_bucket_and_a_monthly_quota(signed_in_page):
    page = signed_in_page
    loads = PageLoads(page)
    page.goto(f"{page.base}/admin/")
    page.click("a:text-is('Plans')")
    page.click(".object-tools a.addlink")
    page.fill("#id_name", "Team")
    page.fill("#id_slug", "team")
    page.click("input[name=_continue]")  # "Save and continue editing": the plan's page
    page.click("#plan-hub .add-rule a:text-is('token bucket')")
    page.fill("#id_name", "team-user")
    page.fill("#id_rate", "100")
    page.fill("#id_period_s_0", "1")
    page.select_option("#id_period_s_1", "minute")
    page.fill("#id_burst", "200")
    page.click("input[name=_save]")  # back on the plan's page
    page.click("#plan-hub .add-rule a:text-is('calendar quota')")
    page.fill("#id_name", "team-month")
    page.fill("#id_rate", "10000")
    page.select_option("#id_calendar_period", "month")
    page.click("input[name=_save]")
    page.wait_for_selector("#plan-hub")
    assert page.locator("#plan-hub ul[aria-labelledby=plan-rules] li").all_inner_texts() == [
        "team-month: 10,000 requests per month per user or API key, reset at midnight on the "
        "1st (UTC); enforced",
        "team-user: 100 requests per minute per user or API key, bursts up to 200; enforced"]
    print("page loads to create the plan:", loads.count)
    assert loads.count <= 12


def test_an_operator_gives_a_customer_twice_their_limit_for_a_week(signed_in_page):
    page = signed_in_page
    loads = PageLoads(page)
    page.goto(f"{page.base}/admin/")
    page.click("a:text-is('Identity overrides')")
    page.click(".object-tools a.addlink")
    key = ApiKey.objects.get(prefix="rk_alice")
    # the key found by typing its prefix (Django's autocomplete), × 2 already chosen
    page.click(".field-api_key .select2-selection")
    page.fill(".select2-search__field", "rk_ali")
    page.click(".select2-results__option:has-text('rk_alice')")
    page.select_option("#id_rule", label="free-user")
    page.fill("#id_duration_0", "7")
    page.fill("#id_reason", "launch week")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    override = IdentityOverride.objects.get(api_key=key)
    assert (override.factor, override.rate, override.rule.name) == (2, None, "free-user")
    week = timezone.now() + datetime.timedelta(days=7)
    assert abs(override.ends_at - week) < datetime.timedelta(seconds=30)
    assert override.ends_at - override.starts_at == datetime.timedelta(days=7)
    print("page loads to give twice the limit for a week:", loads.count)
    assert loads.count <= 6  # (4 on Django 5.2, 5 on 6.x, which loads the message page twice)


def test_an_operator_tops_up_a_credit_account(signed_in_page):
    page = signed_in_page
    loads = PageLoads(page)
    page.goto(f"{page.base}/admin/")
    page.click("a:text-is('Credit accounts')")
    page.click("#result_list tbody tr:first-child th a")
    page.fill("#id_units", "500")
    page.fill("#id_note", "invoice 42")
    page.click("#credit-top-up-form input[type=submit]")
    page.wait_for_selector(".messagelist .success")
    assert "Credited 500 units" in page.locator(".messagelist .success").inner_text()
    print("page loads to top up an account:", loads.count)
    assert loads.count <= 6


def test_an_operator_finds_why_a_caller_is_refused(signed_in_page):
    page = signed_in_page
    for _ in range(45):  # the anonymous caller of the free plan: free-ip bursts up to 40
        try:
            get(f"{page.base}/api/items/")
        except urllib.error.HTTPError as refused:
            assert refused.code == 429
    limiter().flusher.flush_now()
    loads = PageLoads(page)
    page.goto(f"{page.base}/admin/")
    page.click("a:text-is('Simulator')")
    page.fill("#id_ip", "127.0.0.1")
    page.select_option("#id_endpoint", "api:items")
    page.click("input[value=Simulate]")
    page.wait_for_selector("#verdict")
    verdict = page.locator("#verdict").inner_text()
    assert "free-ip" in verdict, verdict
    print("page loads to find why a caller is refused:", loads.count)
    assert loads.count <= 5


def test_the_quickstart_admin_route_saves_five_requests_per_minute(page, live_server, settings):
    """docs/tutorial/quickstart.md, step 6 in the admin, done exactly as written on an empty
    database: the number typed as the period is read in the unit the page presets, and the
    words shown before saving are the rule saved."""
    from django.contrib.auth import get_user_model

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_user_model().objects.create_superuser("admin", "admin@example.com", "admin")
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    # 1. Plans ▸ Add plan: name Free (the slug follows), both defaults ticked. Save.
    page.click("a:text-is('Plans')")
    page.click(".object-tools a.addlink")
    page.locator("#id_name").press_sequentially("Free")  # typed: Django's script fills the slug
    expect(page.locator("#id_slug")).to_have_value("free")
    page.check("#id_default_for_authenticated")
    page.check("#id_default_for_anonymous")
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    # 2. Rules ▸ Add rule ▸ Token bucket: name, plan, scope, the numbers; the rest as it is.
    page.goto(f"{live_server.url}/admin/")
    page.click("a:text-is('Rules')")
    page.click(".object-tools a.addlink")
    page.click("li[data-kind='token_bucket'] a:text-is('Token bucket')")
    page.fill("#id_name", "free-ip")
    page.select_option("#id_plan", label="Free")
    page.select_option("#id_scope", label="Client IP (each address)")
    page.fill("#id_rate", "5")
    page.fill("#id_period_s_0", "60")
    page.fill("#id_burst", "5")
    assert page.locator("#id_period_s_1 option:checked").inner_text() == "second(s)"
    expect(page.locator("#rule-in-words")).to_have_text(
        "5 requests per minute per client IP, bursts up to 5; enforced")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "admin_quickstart_rule.png", full_page=True)
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    rule = Rule.objects.get(name="free-ip")
    assert (rule.plan.slug, rule.scope, rule.rate, rule.period_s, rule.burst) == \
        ("free", "ip", 5, 60, 5)
    assert form_kind_of(rule).sentence(rule) == \
        "5 requests per minute per client IP, bursts up to 5; enforced"
    # and the page says what this test typed and read
    quickstart = " ".join((ROOT / "docs" / "tutorial" / "quickstart.md").read_text().split())
    assert ("*Requests* `5` *per* `60` *second(s)*" in quickstart
            and '"5 requests per minute per client IP, bursts up to 5; enforced"' in quickstart)
