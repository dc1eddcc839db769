"""The admin: endpoint pickers, operator-worded validation (main forms and inlines), API keys,
lists, and the simulator's link. Driven through the real admin views as a superuser."""

import logging
import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

from ratelimit_app.admin.forms import EndpointField, RuleForm
from ratelimit_app.models import ApiKey, EndpointCost, Plan, Rule, hash_api_key

pytestmark = pytest.mark.django_db

DEMO_ENDPOINTS = ["api:items", "api:reports", "api:search", "hello"]
# never charged: /health is in EXEMPT_PATHS, the usage and metrics views are @ratelimit_exempt
EXEMPT_DEMO_ENDPOINTS = {"health", "ratelimit_app:usage", "ratelimit_app:prometheus"}


def assert_offers_demo_endpoints(values):
    """The picker offers "" (none) and the demo's real endpoints, never an admin URL or an
    exempt endpoint."""
    assert values[0] == ""
    assert set(DEMO_ENDPOINTS) <= set(values)
    assert not [v for v in values if v.startswith("admin:")]
    assert not EXEMPT_DEMO_ENDPOINTS & set(values)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def make_plan(slug="free", **fields):
    return Plan.objects.create(slug=slug, name=slug.capitalize(), **fields)


def make_rule(name="free-user", plan=None, **fields):
    values = {"scope": "user", "rate": 60, "period_s": 60, "burst": 30, **fields}
    return Rule.objects.create(name=name, plan=plan, **values)


def rule_add_url(kind="token_bucket"):
    """The add page of a kind's form (without a kind, the page asks for one)."""
    return reverse("admin:ratelimit_app_rule_add") + f"?kind={kind}"


def rule_post(**fields):
    return {"name": "new-rule", "plan": "", "scope": "user", "endpoint": "", "rate": "100",
            "period_s": "60", "burst": "20", "counts": "requests", "lease": "0", "mode": "enforce",
            "on_redis_failure": "default", "enabled": "on", **fields}


def inline_post(prefix, rows, initial=0):
    """POST data of one inline: ``rows`` are dicts of field values (with ``id`` for old rows)."""
    data = {f"{prefix}-TOTAL_FORMS": str(len(rows)), f"{prefix}-INITIAL_FORMS": str(initial),
            f"{prefix}-MIN_NUM_FORMS": "0", f"{prefix}-MAX_NUM_FORMS": "1000"}
    for i, row in enumerate(rows):
        data.update({f"{prefix}-{i}-{key}": value for key, value in row.items()})
    return data


def plan_post(plan, costs=(), costs_initial=0):
    data = {"slug": plan.slug, "name": plan.name, "description": ""}
    data.update(inline_post("costs", costs, costs_initial))
    return data


def new_cost_row(plan, **fields):
    return {"plan": str(plan.pk), "id": "", "endpoint": "api:search", "method": "GET",
            "cost": "5", **fields}


def page_errors(response):
    """Every error on an admin add/change page, by field ("rules-0-burst" for inline rows)."""
    errors = {}
    form = response.context["adminform"].form
    for field, messages in form.errors.items():
        errors[field] = list(messages)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        for i, row in enumerate(formset.forms):
            for field, messages in row.errors.items():
                errors[f"{formset.prefix}-{i}-{field}"] = list(messages)
    return errors


def option_values(html, select_name):
    select = re.search(rf'<select name="{re.escape(select_name)}".*?</select>', html, re.DOTALL)
    return re.findall(r'<option value="([^"]*)"', select.group(0))


# --- endpoint picker -------------------------------------------------------------------------

def test_rule_form_offers_the_urlconf_endpoints_not_admin_ones(admin_client):
    html = admin_client.get(rule_add_url()).content.decode()
    assert_offers_demo_endpoints(option_values(html, "endpoint"))
    assert "<option value=\"\" selected>Every endpoint</option>" in html
    assert "api:search — GET /api/search/ (Search)" in html


def test_cost_form_and_plan_inlines_offer_the_same_endpoints(admin_client):
    html = admin_client.get(reverse("admin:ratelimit_app_endpointcost_add")).content.decode()
    assert_offers_demo_endpoints(option_values(html, "endpoint"))
    plan = make_plan()
    html = admin_client.get(reverse("admin:ratelimit_app_plan_change", args=[plan.pk])).content
    assert_offers_demo_endpoints(option_values(html.decode(), "costs-__prefix__-endpoint"))


def test_unknown_endpoint_is_refused_with_a_clear_message(admin_client):
    response = admin_client.post(rule_add_url(),
                                 rule_post(endpoint="api:nope"))
    assert page_errors(response) == {"endpoint": [
        ("“api:nope” is not an endpoint of this project: pick one from the list (the URL names "
         "of the URLconf).")]}
    assert not Rule.objects.exists()


def test_endpoint_gone_from_urlconf_still_shows_flagged_and_survives_a_save(admin_client):
    rule = make_rule(name="old-export", endpoint="api:export", burst=5)
    url = reverse("admin:ratelimit_app_rule_change", args=[rule.pk])
    html = admin_client.get(url).content.decode()
    assert option_values(html, "endpoint")[-1] == "api:export"
    assert ('<option value="api:export" selected>api:export — ⚠ not in the URLconf any more'
            in html)
    assert "⚠ “api:export” is not in the URLconf any more: no request matches it." in html

    response = admin_client.post(url, rule_post(name="old-export", endpoint="api:export",
                                                 burst="7"))
    assert response.status_code == 302, page_errors(response)
    rule.refresh_from_db()
    assert (rule.endpoint, rule.burst) == ("api:export", 7)


def test_an_exempt_endpoint_is_not_offered_and_a_stored_one_stays_flagged(admin_client):
    response = admin_client.post(rule_add_url(),
                                 rule_post(endpoint="health"))
    assert list(page_errors(response)) == ["endpoint"] and not Rule.objects.exists()

    rule = make_rule(name="health-checks", endpoint="health", burst=5)  # saved before exempt
    url = reverse("admin:ratelimit_app_rule_change", args=[rule.pk])
    html = admin_client.get(url).content.decode()
    assert option_values(html, "endpoint")[-1] == "health"
    assert ('<option value="health" selected>health — ⚠ exempt from limits (EXEMPT_PATHS or '
            '@ratelimit_exempt)</option>') in html
    assert "⚠ “health” is exempt from limits (EXEMPT_PATHS or @ratelimit_exempt): no request " \
        "to it is charged." in html
    response = admin_client.post(url, rule_post(name="health-checks", endpoint="health",
                                                 burst="7"))
    assert response.status_code == 302, page_errors(response)  # kept, not lost on a save


def test_changelist_flags_and_filters_rows_whose_endpoint_left_the_urlconf(admin_client):
    make_rule(name="old-export", endpoint="api:export")
    make_rule(name="search-only", endpoint="api:search")
    make_rule(name="everything")
    changelist = reverse("admin:ratelimit_app_rule_changelist")
    html = admin_client.get(changelist).content.decode()
    assert html.count("requests to api:export per minute, bursts up to 30 <strong style=\"color: "
                      "var(--error-fg)\">⚠ not in the URLconf any more</strong>") == 1
    missing = admin_client.get(changelist, {"endpoint_state": "missing"})
    assert [r.name for r in missing.context["cl"].result_list] == ["old-export"]
    current = admin_client.get(changelist, {"endpoint_state": "current"})
    assert [r.name for r in current.context["cl"].result_list] == ["search-only"]


def test_endpoint_field_keeps_a_missing_current_value_on_offer():
    field = EndpointField(current="api:gone", required=False)
    assert field.clean("api:gone") == "api:gone"
    assert field.clean("api:items") == "api:items"
    assert field.valid_value("api:other-gone") is False


# --- validation messages ---------------------------------------------------------------------

def test_rule_numbers_below_one_get_one_clear_message_each(admin_client):
    response = admin_client.post(rule_add_url(),
                                 rule_post(rate="0", period_s="-5", burst="0"))
    assert page_errors(response) == {
        "rate": ["The rate must be at least 1 token per period."],
        "period_s": ["The period must be at least 1 second."],
        "burst": ["The burst must be at least 1 token."],
    }


def test_rule_period_above_a_year_is_refused_in_words(admin_client):
    response = admin_client.post(rule_add_url(),
                                 rule_post(period_s="40000000"))
    assert page_errors(response) == {
        "period_s": ["The period can be at most 366 days (31622400 seconds)."]}


def test_rule_name_must_be_header_safe(admin_client):
    response = admin_client.post(rule_add_url(),
                                 rule_post(name="free user"))
    assert page_errors(response) == {"name": [
        ("Use 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit: clients "
         "read this name in the RateLimit headers.")]}


def test_rule_burst_below_the_largest_cost_is_refused(admin_client):
    EndpointCost.objects.create(endpoint="api:search", method="GET", cost=5)
    response = admin_client.post(rule_add_url(), rule_post(burst="3"))
    assert page_errors(response) == {"burst": [
        ("Burst 3 is below the cost of api:search (GET) (5 tokens): such requests could never "
         "pass. Raise the burst to at least 5.")]}
    # an endpoint rule counts calls, one token each: the cost does not apply to it
    response = admin_client.post(rule_add_url(),
                                 rule_post(burst="3", endpoint="api:search"))
    assert response.status_code == 302


def test_duplicate_endpoint_cost_is_refused(admin_client):
    EndpointCost.objects.create(endpoint="api:search", method="GET", cost=5)
    response = admin_client.post(reverse("admin:ratelimit_app_endpointcost_add"),
                                 {"endpoint": "api:search", "method": "GET", "plan": "",
                                  "cost": "3"})
    assert page_errors(response) == {"__all__": [
        "api:search (GET) already has a cost; edit that row instead of adding a second one."]}
    assert EndpointCost.objects.count() == 1


def test_cost_above_a_rule_burst_is_refused(admin_client):
    make_rule(name="free-user", burst=30)
    response = admin_client.post(reverse("admin:ratelimit_app_endpointcost_add"),
                                 {"endpoint": "api:reports", "method": "POST", "plan": "",
                                  "cost": "50"})
    assert page_errors(response) == {"cost": [
        ("Rule “free-user” has burst 30, below this cost: such requests could never pass. "
         "Lower the cost or raise that rule's burst.")]}


def test_second_default_plan_is_refused(admin_client):
    make_plan("free", default_for_anonymous=True)
    response = admin_client.post(reverse("admin:ratelimit_app_plan_add"),
                                 {"slug": "trial", "name": "Trial", "description": "",
                                  "default_for_anonymous": "on"})
    assert page_errors(response) == {"default_for_anonymous": [
        "“Free” is already the default plan for anonymous clients; untick it there first."]}


# --- inlines on the plan page ----------------------------------------------------------------

def test_plan_page_cost_is_checked_against_the_plan_rules(admin_client):
    plan = make_plan("team")
    make_rule(name="team-user", plan=plan, burst=10)
    url = reverse("admin:ratelimit_app_plan_change", args=[plan.pk])
    response = admin_client.post(url, plan_post(
        plan, costs=[new_cost_row(plan, endpoint="api:reports", method="POST", cost="20")]))
    assert page_errors(response) == {
        "costs-0-cost": [("Rule “team-user” has burst 10, below this cost: such requests could "
                          "never pass. Lower the cost or raise that rule's burst.")],
    }
    assert not plan.costs.exists()


@pytest.mark.parametrize("rule", [
    {"kind": "credits", "rate": 0},  # stores burst 1: not a burst it enforces
    {"kind": "credits", "rate": 3, "calendar_period": "day"},
    {"kind": "concurrency", "rate": 2, "period_s": 30},
], ids=["credits-without-allowance", "credits-3-a-day", "concurrency-of-2"])
def test_plan_page_rules_without_a_burst_accept_any_cost(admin_client, rule):
    plan = make_plan("team")
    saved = Rule(name="team-rule", plan=plan, scope="user", **rule)
    saved.full_clean()
    saved.save()
    url = reverse("admin:ratelimit_app_plan_change", args=[plan.pk])
    response = admin_client.post(url, plan_post(
        plan, costs=[new_cost_row(plan, endpoint="api:reports", method="POST", cost="50")]))
    assert response.status_code == 302, page_errors(response)
    assert plan.costs.get().cost == 50


def test_plan_page_token_bucket_and_calendar_quota_refuse_a_cost_above_them_in_their_words(
        admin_client):
    plan = make_plan("team")
    url = reverse("admin:ratelimit_app_plan_change", args=[plan.pk])
    cost = new_cost_row(plan, endpoint="api:reports", method="POST", cost="6")
    bucket = make_rule(name="team-user", plan=plan, burst=5)
    response = admin_client.post(url, plan_post(plan, costs=[cost]))
    assert page_errors(response) == {
        "costs-0-cost": [("Rule “team-user” has burst 5, below this cost: such requests could "
                          "never pass. Lower the cost or raise that rule's burst.")],
    }
    bucket.delete()
    quota = Rule(name="team-daily", plan=plan, scope="user", kind="calendar",
                 calendar_period="day", rate=4)
    quota.full_clean()
    quota.save()
    response = admin_client.post(url, plan_post(plan, costs=[cost | {"cost": "5"}]))
    assert page_errors(response) == {
        "costs-0-cost": [("Rule “team-daily” is a quota of 4 units a day, below this cost: such "
                          "requests could never pass. Lower the cost or raise that quota.")],
    }
    assert not plan.costs.exists()


def test_inline_duplicate_costs_on_one_page_are_refused(admin_client):
    plan = make_plan("team")
    url = reverse("admin:ratelimit_app_plan_change", args=[plan.pk])
    response = admin_client.post(url, plan_post(plan, costs=[
        new_cost_row(plan, cost="3"), new_cost_row(plan, cost="4")]))
    assert page_errors(response) == {"costs-1-__all__": [
        "api:search (GET on Team) is listed twice on this page; keep one row."]}
    assert not plan.costs.exists()


def test_inline_duplicate_of_a_saved_cost_is_refused(admin_client):
    plan = make_plan("team")
    EndpointCost.objects.create(endpoint="api:search", method="GET", plan=plan, cost=5)
    url = reverse("admin:ratelimit_app_plan_change", args=[plan.pk])
    saved = plan.costs.get()
    response = admin_client.post(url, plan_post(plan, costs_initial=1, costs=[
        {"plan": str(plan.pk), "id": str(saved.pk), "endpoint": "api:search", "method": "GET",
         "cost": "5"},
        new_cost_row(plan, cost="2")]))
    assert page_errors(response) == {"costs-1-__all__": [
        ("api:search (GET on Team) already has a cost; edit that row instead of adding a second "
         "one.")]}


def test_valid_inline_rows_are_saved(admin_client):
    plan = make_plan("team")
    url = reverse("admin:ratelimit_app_plan_change", args=[plan.pk])
    response = admin_client.post(url, plan_post(
        plan, costs=[new_cost_row(plan, endpoint="api:reports", method="POST", cost="20")]))
    assert response.status_code == 302, page_errors(response)
    assert plan.costs.get().cost == 20


def test_plan_add_page_asks_to_save_before_adding_rules(admin_client):
    response = admin_client.get(reverse("admin:ratelimit_app_plan_add"))
    assert response.context["inline_admin_formsets"] == []
    assert b"Save the plan first" in response.content


def test_rule_form_class_words_the_limits_outside_the_admin_too():
    form = RuleForm(data=rule_post(rate="0"))
    assert form.errors == {"rate": ["The rate must be at least 1 token per period."]}


# --- lists, search, help texts ---------------------------------------------------------------

def test_rule_list_spells_rules_out_searches_and_filters(admin_client):
    free = make_plan("free")
    make_rule(name="free-user", plan=free, rate=100, period_s=60, burst=20)
    make_rule(name="pro-ip", scope="ip")
    changelist = reverse("admin:ratelimit_app_rule_changelist")
    response = admin_client.get(changelist)
    assert b"100 requests per minute, bursts up to 20" in response.content
    assert b'href="/admin/ratelimit_monitoring/simulator/"' in response.content
    found = admin_client.get(changelist, {"q": "free"}).context["cl"].result_list
    assert [r.name for r in found] == ["free-user"]
    found = admin_client.get(changelist, {"scope__exact": "ip"}).context["cl"].result_list
    assert [r.name for r in found] == ["pro-ip"]


def test_rule_change_page_explains_the_rule_in_words(admin_client):
    rule = make_rule(name="free-ip", scope="ip", rate=20, period_s=60, burst=40)
    html = admin_client.get(reverse("admin:ratelimit_app_rule_change", args=[rule.pk])).content
    assert ('<p id="rule-in-words" aria-live="polite" aria-labelledby="rule-words-title">20 '
            'requests per minute per client IP, bursts up to 40; enforced</p>') in html.decode()
    rule = make_rule(name="free-reports", endpoint="api:reports", rate=5, period_s=3600, burst=5)
    html = admin_client.get(reverse("admin:ratelimit_app_rule_change", args=[rule.pk])).content
    assert ("5 requests to api:reports per hour per user or API key, bursts up to 5; "
            "enforced") in html.decode()


def test_in_words_after_a_refused_save_reads_what_was_typed_beside_its_error(admin_client):
    """After a refused save the words read the numbers typed (shown beside the error that
    refuses them, as the live preview showed them), and nothing is stored."""
    rule = make_rule(name="free-ip", scope="ip", rate=20, period_s=60, burst=40)
    EndpointCost.objects.create(endpoint="api:search", method="GET", cost=10)
    url = reverse("admin:ratelimit_app_rule_change", args=[rule.pk])
    response = admin_client.post(url, rule_post(name="free-ip", scope="ip", rate="30",
                                                burst="5"))
    assert "burst" in page_errors(response)  # refused: below the cost of a search
    assert response.context["rule_words"] == \
        "30 requests per minute per client IP, bursts up to 5; enforced"
    rule.refresh_from_db()
    assert (rule.rate, rule.burst) == (20, 40)
    response = admin_client.post(rule_add_url(), rule_post(rate="0"))
    assert response.context["rule_words"] == "Type the numbers to read the rule in words."


def test_plan_list_counts_rules_and_costs(admin_client):
    plan = make_plan("pro")
    make_rule(name="pro-user", plan=plan)
    make_rule(name="pro-ip", plan=plan, scope="ip")
    EndpointCost.objects.create(endpoint="api:search", method="GET", plan=plan, cost=2)
    response = admin_client.get(reverse("admin:ratelimit_app_plan_changelist"))
    row = response.context["cl"].result_list[0]
    assert (row.rule_count, row.cost_count) == (2, 1)


# --- API keys --------------------------------------------------------------------------------

def cookie_texts(client, response):
    """Every cookie value the response set or the client holds, the messages cookie decoded."""
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.http import HttpRequest

    texts = [morsel.OutputString() for morsel in response.cookies.values()]
    texts += [morsel.value for morsel in client.cookies.values()]
    for jar in (response.cookies, client.cookies):
        if "messages" in jar:
            decoded = CookieStorage(HttpRequest())._decode(jar["messages"].value) or []
            texts += [str(message) for message in decoded]
    return texts


def test_d7_new_api_key_is_shown_once_never_in_a_cookie_or_log(admin_client, admin_user, caplog):
    caplog.set_level(logging.DEBUG)
    response = admin_client.post(reverse("admin:ratelimit_callers_apikey_add"),
                                 {"user": str(admin_user.pk), "name": "ci", "plan": "",
                                  "tenant": "", "active": "on"})
    # the POST's own response shows it (no redirect, so no URL or message carries it)
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    body = response.content.decode()
    raw_key = re.search(r'<code id="new-api-key">(rk_[\w-]+)</code>', body).group(1)
    assert body.count(raw_key) == 1 and "cannot be shown again" in body
    key = ApiKey.objects.get()
    assert (key.digest, key.prefix) == (hash_api_key(raw_key), raw_key[:8])
    assert raw_key not in [str(value) for value in ApiKey.objects.values().get().values()]

    assert raw_key.encode() not in response.serialize_headers()  # e.g. no Location
    assert not [text for text in cookie_texts(admin_client, response) if raw_key in text]
    later = admin_client.get(reverse("admin:ratelimit_callers_apikey_changelist"))
    assert raw_key.encode() not in later.content  # no message left to show it again
    assert not [text for text in cookie_texts(admin_client, later) if raw_key in text]
    assert raw_key not in str(dict(admin_client.session))
    assert raw_key not in caplog.text
    assert not LogEntry.objects.filter(change_message__contains=raw_key).exists()
    assert not LogEntry.objects.filter(object_repr__contains=raw_key).exists()

    change_url = reverse("admin:ratelimit_callers_apikey_change", args=[key.pk])
    assert raw_key.encode() not in admin_client.get(change_url).content
    response = admin_client.post(change_url, {"user": str(admin_user.pk), "name": "ci-renamed",
                                              "plan": "", "tenant": "", "active": "on"},
                                 follow=True)
    key.refresh_from_db()
    assert (key.name, key.digest) == ("ci-renamed", hash_api_key(raw_key))  # not re-keyed
    assert raw_key.encode() not in response.content


def warnings_shown(response):
    return [str(m) for m in get_messages(response.wsgi_request) if m.level_tag == "warning"]


def test_d4_a_burst_below_the_cost_header_maximum_is_warned_about(admin_client):
    # the demo settings: COST_HEADER X-Request-Cost, MAX_COST 50
    response = admin_client.post(rule_add_url(),
                                 rule_post(name="small", burst="20"), follow=True)
    assert warnings_shown(response) == [
        "Rule “small” has burst 20, below MAX_COST (50): a request declaring a cost above 20 in "
        "X-Request-Cost can never pass it and is refused without Retry-After. Raise the burst "
        "or lower MAX_COST if that is not meant."]
    assert Rule.objects.filter(name="small").exists()  # a warning, not a refusal
    for fields in ({"name": "big", "burst": "50"},                       # holds MAX_COST
                   {"name": "calls", "burst": "3", "endpoint": "api:search"}):  # counts calls
        response = admin_client.post(rule_add_url(),
                                     rule_post(**fields), follow=True)
        assert warnings_shown(response) == []


def test_d4_no_warning_without_a_cost_header(admin_client, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "COST_HEADER": None}
    response = admin_client.post(rule_add_url(),
                                 rule_post(name="small", burst="20"), follow=True)
    assert warnings_shown(response) == []


def test_d4_an_override_burst_below_the_cost_header_maximum_is_warned_about(admin_client):
    response = admin_client.post(reverse("admin:ratelimit_callers_identityoverride_add"),
                                 {"ip": "192.0.2.1", "rate": "5", "period_s": "60",
                                  "burst": "10", "reason": ""}, follow=True)
    assert len(warnings_shown(response)) == 1
    assert "burst 10, below MAX_COST (50)" in warnings_shown(response)[0]


def test_failed_auth_rule_is_explained_in_words(admin_client):
    rule = make_rule(name="auth-failures", scope="ip", counts="failed_auth", rate=1,
                     period_s=60, burst=10)
    response = admin_client.get(reverse("admin:ratelimit_app_rule_change", args=[rule.pk]))
    assert response.context["rule_words"] == \
        "1 failed authentication per minute per client IP, up to 10 in a row; enforced"
    assert "Failed authentications" in response.content.decode()  # its own form's label


def test_the_rules_list_gives_a_rules_last_hour_in_one_cell():
    from types import SimpleNamespace

    from ratelimit_app.admin.config import RuleAdmin

    cell = RuleAdmin.last_hour_cell
    assert cell(None, SimpleNamespace(traffic=None)) == "—"  # Redis could not be read
    assert cell(None, SimpleNamespace(traffic={"requests": 0, "rate": 0})) == "no requests"
    assert cell(None, SimpleNamespace(traffic={"requests": 1204, "rate": 3.2})) == \
        "1,204<br>3.2 % refused"
