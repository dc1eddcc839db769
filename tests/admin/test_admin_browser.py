"""The admin pages in Debian's Chromium: the simulator round trip, the plan page as the hub,
and rules of each kind (token bucket, calendar quota, concurrency limit) typed in and enforced.

Screenshots go to ``screenshots/`` (git-ignored) for a person to look at.
"""

from fractions import Fraction

import django
import pytest

from tests.helpers import (SCREENSHOTS, breadcrumbs_of, first_option_text, load_demo_data,
                           poll_until)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("orm_beside_playwright")]



def test_login_and_admin_pages_have_no_console_error_not_even_a_favicon(page, live_server,
                                                                         settings):
    """The admin's login page had no icon link, so the browser asked for /favicon.ico: a 404
    and a console error. Nothing is filtered here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    load_demo_data()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(m.text))
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.on("requestfailed", lambda r: problems.append(f"failed {r.url}: {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{r.status} {r.url}"))
    page.goto(f"{live_server.url}/admin/login/")
    assert page.locator('link[rel="icon"]').get_attribute("href") == "data:,"
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")
    for path in ("/admin/", "/admin/ratelimit_app/rule/", "/admin/ratelimit_callers/apikey/add/"):
        # Each page settles before the next: leaving a page while its icons still load aborts
        # them, and the browser reports that as a failed request that is no fault of the page.
        page.goto(f"{live_server.url}{path}", wait_until="networkidle")
        assert page.locator('link[rel="icon"]').count() >= 1, path
    assert problems == []


def test_simulator_round_trip_from_the_rule_list(signed_in_page):
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_app/rule/")
    page.click("text=Simulate a request")
    page.click(".field-user .select2-selection")  # the user picker: search, pick
    page.fill(".select2-search__field", "ali")
    page.click(".select2-results__option:has-text('alice')")
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


def test_plan_page_is_the_hub_and_offers_real_endpoints_in_its_costs(signed_in_page):
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_app/plan/")
    page.click("#result_list a:text-is(\"Free\")")
    page.wait_for_selector("#plan-hub")
    # its rules in words, each a link to its page
    assert page.locator('li[data-rule="free-ip"]').inner_text() == \
        "free-ip: 20 requests per minute per client IP, bursts up to 40; enforced"
    page.click("text=Add another Endpoint cost for this plan")
    options = page.eval_on_selector_all("#id_costs-0-endpoint option",
                                        "options => options.map(o => o.textContent)")
    assert "api:items — GET /api/items/ (Item List)" in options
    assert not [o for o in options if o.startswith("admin:")]
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "admin_plan.png", full_page=True)
    assert page.problems == []


def test_the_apps_own_admin_pages_wear_the_admins_breadcrumbs_bar(signed_in_page):
    """Django 6.1 styles only <ol class="breadcrumbs"> (up to 6.0 only <div class="breadcrumbs">):
    the simulator and the new-key page must look like a stock admin page of the running version,
    not show plain links."""
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_app/rule/")
    stock = breadcrumbs_of(page)["look"]  # the changelist: Django's own template
    assert stock["background"] != "rgba(0, 0, 0, 0)" and stock["rows"] == 1
    page.click("text=Simulate a request")
    simulator = breadcrumbs_of(page)
    assert simulator["look"] == stock
    assert simulator["links"] == ["Home", "Rate limits · Monitoring", "Simulator"]
    assert simulator["text"].endswith("What would this request do?")

    page.goto(f"{page.base}/admin/ratelimit_callers/apikey/add/")
    from django.contrib.auth import get_user_model
    page.fill("#id_user", str(get_user_model().objects.get(username="admin").pk))  # a raw id
    page.fill("#id_name", "breadcrumbs")
    page.click("input[name=_save]")
    page.wait_for_selector("#new-api-key")
    created = breadcrumbs_of(page)
    assert created["look"] == stock
    assert created["links"] == ["Home", "Rate limits · Callers", "API keys"]
    assert created["text"].endswith("breadcrumbs")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "admin_new_api_key.png")
    assert page.problems == []


def test_endpoint_pickers_offer_djangos_own_blank_choice(signed_in_page):
    """Django 6.1 labels a select's blank choice "- Select an option -" (up to 6.0 "---------"):
    the endpoint pickers take it from Django, so they match the admin's selects beside them."""
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_app/endpointcost/add/")
    djangos = first_option_text(page, "#id_plan")  # the admin's own select of a foreign key
    assert djangos == ("- Select an option -" if django.VERSION >= (6, 1) else "---------")
    assert first_option_text(page, "#id_endpoint") == djangos
    page.goto(f"{page.base}/admin/ratelimit_app/rule/")
    page.click("text=Simulate a request")
    assert first_option_text(page, "#id_endpoint") == djangos
    page.goto(f"{page.base}/admin/ratelimit_app/rule/add/?kind=token_bucket")
    assert first_option_text(page, "#id_endpoint") == "Every endpoint"  # a rule's blank means it
    assert page.problems == []


def rate_limit_of(url, policy):
    """GET ``url``; return ``(tokens per second, remaining)`` of ``policy`` from the RateLimit
    headers (the rate is q / w, however the headers map the bucket onto q and w)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:  # closed: no ResourceWarning
        headers = response.headers
    found = {}
    for field in ("RateLimit-Policy", "RateLimit"):
        items = dict(item.split(";", 1) for item in headers[field].split(", "))
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


def add_rule(page, *, name, plan, scope, kind, rate, endpoint="", calendar_period="",
             period=None):
    """Fill the admin's "Add rule" page of ``kind`` as an operator would and press Save:
    "Add rule" on the list, the kind on the page that asks it, then that kind's form."""
    page.goto(f"{page.base}/admin/ratelimit_app/rule/")
    page.click(".object-tools a.addlink")  # the changelist's "Add rule" button
    page.click(f'li[data-kind="{kind}"] a')
    page.wait_for_selector("#id_name")
    page.fill("#id_name", name)
    page.select_option("#id_plan", label=plan)
    page.select_option("#id_scope", scope)
    if endpoint:
        page.select_option("#id_endpoint", endpoint)
    if calendar_period:
        page.select_option("#id_calendar_period", calendar_period)
    page.fill("#id_rate", str(rate))
    if period is not None:
        page.fill("#id_period_s_0", str(period[0]))
        page.select_option("#id_period_s_1", period[1])
    page.click("input[name=_save]")


def changelist_row(page, name):
    """The changelist row of the rule ``name`` (the page the admin lands on after a save)."""
    return page.locator(f'#result_list tbody tr:has(th.field-name a:text-is("{name}"))')


def month_lengths_s():
    """The length in seconds of the current calendar month (in CALENDAR_TIME_ZONE)."""
    from ratelimit_app.decision import periods

    bounds = periods.bounds_at("month", periods.now_ms())
    return (bounds.next_ms - bounds.start_ms) // 1000


def get_headers(url):
    """GET ``url`` through the live server (as any client would); return its headers."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        response.read()
        return response.headers


def policy_items(headers, field):
    """``{policy name: {param: value}}`` of a RateLimit-Policy / RateLimit header."""
    items = {}
    for item in headers[field].split(", "):
        name, params = item.split(";", 1)
        items[name.strip('"')] = dict(p.split("=", 1) for p in params.split(";"))
    return items


def test_a_calendar_quota_created_in_the_admin_is_listed_explained_and_enforced(signed_in_page):
    """“1000 per month” for each client IP of the free plan: typed in the admin, saved, listed
    with its kind, spelled out on its page, and counted on the next real request."""
    page = signed_in_page
    hello = f"{page.base}/hello/"
    before = policy_items(get_headers(hello), "RateLimit-Policy")
    assert "free-ip-month" not in before

    add_rule(page, name="free-ip-month", plan="Free", scope="ip", kind="calendar", rate=1000,
             calendar_period="month")
    page.wait_for_selector(".messagelist .success")
    assert "free-ip-month" in page.locator(".messagelist .success").inner_text()
    row = changelist_row(page, "free-ip-month")
    assert row.count() == 1
    assert row.locator("td.field-limit_cell").inner_text() == \
        "1,000 requests per month, reset at midnight on the 1st (UTC)"
    assert row.locator("td.field-scope_cell").inner_text() == "client IP"

    row.locator("th.field-name a").click()
    page.wait_for_selector("#id_name")
    assert page.locator("#id_calendar_period").input_value() == "month"
    assert page.locator("#id_period_s_0").count() == 0  # a quota has no period in seconds
    assert page.locator("#rule-in-words").inner_text() == (
        "1,000 requests per month per client IP, reset at midnight on the 1st (UTC); enforced")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "admin_rule_calendar.png", full_page=True)

    # the limiter counts it from the next request on: q = 1000 per month (w = the month's
    # length), and each request through the live server uses one unit of this address's quota
    lengths = {month_lengths_s()}
    first = get_headers(hello)
    second = get_headers(hello)
    lengths.add(month_lengths_s())
    policy = policy_items(second, "RateLimit-Policy")["free-ip-month"]
    assert policy["q"] == "1000"
    assert int(policy["w"]) in lengths
    assert "free-ip" in policy_items(second, "RateLimit-Policy")  # the other rules still apply
    assert policy_items(first, "RateLimit")["free-ip-month"]["r"] == "999"
    assert policy_items(second, "RateLimit")["free-ip-month"]["r"] == "998"
    assert page.problems == []


def test_a_concurrency_limit_created_in_the_admin_is_listed_and_explained(signed_in_page):
    """“at most 5 in flight, a crashed request's slot freed after 1 minute”: its own form, its
    own words."""
    page = signed_in_page
    page.goto(f"{page.base}/admin/ratelimit_app/rule/add/?kind=concurrency")
    # the fields a concurrency limit is typed in say what they mean for it
    assert page.locator("label[for=id_rate]").inner_text() == "At most, in flight"
    # (the timeout's label, beside the number: found by its words, as Django's markup of a
    # line of fields differs between versions)
    assert page.get_by_text("a crashed request's slot freed after", exact=True).count() == 1
    assert page.locator("#id_burst").count() == 0

    add_rule(page, name="hello-in-flight", plan="Free", scope="ip", endpoint="hello",
             kind="concurrency", rate=5, period=(1, "minute"))
    page.wait_for_selector(".messagelist .success")
    row = changelist_row(page, "hello-in-flight")
    assert row.count() == 1
    assert row.locator("td.field-limit_cell").inner_text() == \
        "at most 5 requests to hello in flight, a crashed request's slot freed after 1 minute"

    row.locator("th.field-name a").click()
    page.wait_for_selector("#id_name")
    assert page.locator("#id_period_s_0").input_value() == "1"
    assert page.locator("#id_period_s_1").input_value() == "minute"
    assert page.locator("#rule-in-words").inner_text() == (
        "at most 5 requests to hello in flight per client IP, a crashed request's slot freed "
        "after 1 minute; enforced")
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SCREENSHOTS / "admin_rule_concurrency.png", full_page=True)

    # requests one after another each take and give back a slot: 4 left every time. The
    # server frees a slot in the response's close(), just after its last byte is sent, so the
    # client may read it first: the next request waits for the slot to be free again.
    for _ in range(2):
        response = get_headers(f"{page.base}/hello/")
        assert policy_items(response, "RateLimit-Policy")["hello-in-flight"] == \
            {"q": "5", "qu": '"concurrent-requests"'}
        assert policy_items(response, "RateLimit")["hello-in-flight"]["r"] == "4"
        poll_until(lambda: free_slots("hello-in-flight", endpoint="hello") == 5)
    assert page.problems == []


def free_slots(rule_name, *, endpoint):
    """Free slots of concurrency limit ``rule_name`` for a request from the live server's
    client address to ``endpoint``, as the limiter reads them (nothing taken)."""
    from django.test import RequestFactory

    from ratelimit_app.runtime.limiter import default_limiter

    request = RequestFactory().get("/", REMOTE_ADDR="127.0.0.1")
    peek = default_limiter().peek(request, None, endpoint)
    assert peek.error == ""
    [status] = [s for s in peek.statuses if s.name == rule_name]
    return status.remaining


def test_a_rule_with_a_mistake_shows_the_operators_message_and_is_not_saved(signed_in_page):
    from ratelimit_app.models import Rule

    page = signed_in_page
    add_rule(page, name="no-period", plan="Free", scope="ip", kind="calendar", rate=1000)
    page.wait_for_selector(".errornote")
    assert page.locator(".field-calendar_period .errorlist").inner_text() == \
        "Choose when the quota starts again: every day or every month."
    assert page.locator("#rule-in-words").inner_text() == \
        "Type the numbers to read the rule in words."
    # what the operator typed is kept for the correction
    assert page.locator("#id_rate").input_value() == "1000"
    assert not Rule.objects.filter(name="no-period").exists()

    page.select_option("#id_calendar_period", "day")  # corrected: saved
    page.click("input[name=_save]")
    page.wait_for_selector(".messagelist .success")
    assert changelist_row(page, "no-period").locator("td.field-limit_cell").inner_text() == \
        "1,000 requests per day, reset at midnight (UTC)"
    assert page.problems == []
