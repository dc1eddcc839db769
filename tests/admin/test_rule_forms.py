"""The rule's forms, one per kind of limit (admin/rule_forms.py, config/rule_kinds.py), through
the real admin views: the kind asked first, only the kind's fields, errors in its words, the
preview endpoint's words and the plan page as the hub."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from ratelimit_app.admin.rule_forms import rule_from_input
from ratelimit_app.config.rule_kinds import FORM_KINDS
from ratelimit_app.models import ApiKey, EndpointCost, Plan, PlanAssignment, Rule

from .rule_word_cases import CASES, PENDING, as_form_data

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def add_url(kind="", **params):
    query = "&".join(f"{k}={v}" for k, v in {"kind": kind, **params}.items() if v)
    return reverse("admin:ratelimit_app_rule_add") + (f"?{query}" if query else "")


def form_fields(response):
    return list(response.context["adminform"].form.fields)


def page_errors(response):
    return {name: list(errors) for name, errors in response.context["adminform"].form.errors.items()}


def test_the_add_page_asks_the_kind_first_with_plain_links(admin_client):
    response = admin_client.get(add_url(plan="7"))
    html = response.content.decode()
    assert response.templates[0].name == "admin/ratelimit_app/rule/choose_kind.html"
    links = re.findall(r'<li data-kind="([a-z_]+)"><a href="([^"]+)">', html)
    assert [key for key, _ in links] == list(FORM_KINDS)
    assert dict(links)["calendar"] == "?kind=calendar&amp;plan=7"  # the plan is kept
    assert "<form" not in html.split('id="content-main"')[1]  # links: no JavaScript needed


@pytest.mark.parametrize("key, shown, hidden", [
    ("token_bucket", {"rate", "period_s", "burst", "lease", "debt", "alert_thresholds"},
     {"calendar_period", "kind", "counts", "mode", "enabled"}),
    ("calendar", {"rate", "calendar_period", "debt", "alert_thresholds"},
     {"period_s", "burst", "lease", "kind", "counts"}),
    ("concurrency", {"rate", "period_s"},
     {"burst", "calendar_period", "lease", "debt", "alert_thresholds"}),
    ("credits", {"rate", "calendar_period", "debt", "alert_thresholds"},
     {"endpoint", "period_s", "burst", "lease"}),
    ("failed_auth", {"rate", "period_s", "burst", "endpoint"},
     {"plan", "scope", "calendar_period", "lease", "debt", "alert_thresholds"}),
    ("responses", {"rate", "period_s", "burst", "counted_statuses", "counted_path_prefix"},
     {"calendar_period", "lease", "debt", "alert_thresholds", "kind", "counts"}),
])
def test_each_kind_form_shows_only_its_own_fields_at_most_twelve(admin_client, key, shown,
                                                                  hidden):
    fields = form_fields(admin_client.get(add_url(key)))
    assert shown <= set(fields) and not hidden & set(fields)
    assert {"name", "status", "on_redis_failure"} <= set(fields)
    assert len(fields) <= 12, fields


def test_each_kind_labels_its_numbers_in_its_own_words(admin_client):
    labels = {key: {name: str(field.label) for name, field in admin_client.get(
        add_url(key)).context["adminform"].form.fields.items()} for key in FORM_KINDS}
    assert (labels["token_bucket"]["rate"], labels["token_bucket"]["period_s"],
            labels["token_bucket"]["burst"]) == ("Requests", "per", "bursts up to")
    assert labels["concurrency"]["rate"] == "At most, in flight"
    assert labels["concurrency"]["period_s"] == "a crashed request's slot freed after"
    assert labels["credits"]["rate"] == "Allowance (units)"
    assert labels["credits"]["calendar_period"] == "refilled"
    assert labels["failed_auth"]["rate"] == "Failed authentications"


def base_post(**fields):
    return {"name": "new-rule", "plan": "", "scope": "user", "endpoint": "",
            "status": "enforce", "on_redis_failure": "default", **fields}


def test_a_token_bucket_is_saved_from_its_period_in_units(admin_client):
    response = admin_client.post(add_url("token_bucket"), base_post(
        rate="100", period_s_0="1", period_s_1="minute", burst="200", lease="0", debt="0",
        alert_thresholds=""))
    assert response.status_code == 302, page_errors(response)
    rule = Rule.objects.get()
    assert (rule.kind, rule.rate, rule.period_s, rule.burst, rule.mode, rule.enabled) == \
        ("token_bucket", 100, 60, 200, "enforce", True)
    assert rule.describe() == \
        "100 requests per minute per user or API key, bursts up to 200; enforced"


def test_a_calendar_quota_and_a_shadow_status_are_saved(admin_client):
    response = admin_client.post(add_url("calendar"), base_post(
        rate="10000", calendar_period="month", status="shadow", debt="0",
        alert_thresholds="80,100"))
    assert response.status_code == 302, page_errors(response)
    rule = Rule.objects.get()
    assert (rule.kind, rule.rate, rule.burst, rule.mode) == ("calendar", 10000, 10000, "shadow")
    assert rule.describe() == ("10,000 requests per month per user or API key, reset at "
                               "midnight on the 1st (UTC); shadow (counted, never refused)")


def test_a_failed_auth_limit_is_stored_as_an_ip_token_bucket(admin_client):
    response = admin_client.post(add_url("failed_auth"), base_post(
        name="guessers", rate="10", period_s_0="1", period_s_1="minute", burst="10"))
    assert response.status_code == 302, page_errors(response)
    rule = Rule.objects.get()
    assert (rule.kind, rule.counts, rule.scope, rule.plan) == \
        ("token_bucket", "failed_auth", "ip", None)
    # its page is its own kind's form again
    page = admin_client.get(reverse("admin:ratelimit_app_rule_change", args=[rule.pk]))
    assert page.context["rule_kind_key"] == "failed_auth"


def test_a_limit_on_responses_is_stored_as_a_token_bucket_counting_them(admin_client):
    response = admin_client.post(add_url("responses"), base_post(
        name="scrapers", scope="ip", rate="20", period_s_0="1", period_s_1="minute",
        burst="20", counted_statuses="4xx", counted_path_prefix="/api"))
    assert response.status_code == 302, page_errors(response)
    rule = Rule.objects.get()
    assert (rule.kind, rule.counts, rule.scope, rule.counted_statuses,
            rule.counted_path_prefix) == ("token_bucket", "requests", "ip", "4xx", "/api")
    assert rule.describe() == ("at most 20 responses 4xx under /api per minute per client IP, "
                               "up to 20 in a row; enforced")
    page = admin_client.get(reverse("admin:ratelimit_app_rule_change", args=[rule.pk]))
    assert page.context["rule_kind_key"] == "responses"
    assert page.context["adminform"].form["counted_statuses"].value() == "4xx"
    rules_list = admin_client.get(reverse("admin:ratelimit_app_rule_changelist"))
    assert "at most 20 responses 4xx under /api per minute" in rules_list.content.decode()


@pytest.mark.parametrize("fields, errors", [
    ({}, {"counted_statuses": ["Give the statuses to count (e.g. 404, 401,403 or 4xx), a path "
                               "prefix (e.g. /login), or both."]}),
    ({"counted_statuses": "4o4"}, {"counted_statuses": [
        "“4o4” is not a response status; write statuses such as 401,403 or a class such as "
        "4xx, separated by commas."]}),
    ({"counted_statuses": "600"}, {"counted_statuses": [
        "“600” is not a response status; write statuses such as 401,403 or a class such as "
        "4xx, separated by commas."]}),
    ({"counted_path_prefix": "login"},
     {"counted_path_prefix": ["A path prefix starts with “/”, e.g. /login."]}),
])
def test_a_limit_on_responses_refuses_what_it_cannot_count(admin_client, fields, errors):
    response = admin_client.post(add_url("responses"), base_post(
        scope="ip", rate="20", period_s_0="1", period_s_1="minute", burst="20", **fields))
    assert page_errors(response) == errors
    assert not Rule.objects.exists()


def test_a_limit_on_responses_is_not_held_to_the_endpoint_costs(admin_client):
    # charged one token per counted response: a burst of 5 beside a cost-20 endpoint
    EndpointCost.objects.create(endpoint="api:reports", method="POST", cost=20)
    response = admin_client.post(add_url("responses"), base_post(
        name="failed-logins", scope="ip", rate="5", period_s_0="1", period_s_1="minute",
        burst="5", counted_statuses="401"))
    assert response.status_code == 302, page_errors(response)
    # a token bucket counting every request still is
    response = admin_client.post(add_url("token_bucket"), base_post(
        rate="5", period_s_0="1", period_s_1="minute", burst="5", lease="0", debt="0",
        alert_thresholds=""))
    assert page_errors(response)["burst"][0].startswith("Burst 5 is below the cost of "
                                                        "api:reports (POST) (20 tokens)")


def test_a_token_bucket_form_leaves_a_rule_counting_every_request(admin_client):
    response = admin_client.post(add_url("token_bucket"), base_post(
        rate="5", period_s_0="1", period_s_1="minute", burst="5", lease="0", debt="0",
        alert_thresholds="", counted_statuses="404"))
    assert response.status_code == 302, page_errors(response)
    assert Rule.objects.get().counted_statuses == ""


def test_disabling_keeps_the_mode_for_when_it_is_enabled_again(admin_client):
    rule = Rule.objects.create(name="r", scope="user", rate=5, period_s=60, burst=5,
                               mode="shadow")
    url = reverse("admin:ratelimit_app_rule_change", args=[rule.pk])
    response = admin_client.post(url, base_post(name="r", rate="5", period_s_0="1",
                                                period_s_1="minute", burst="5", lease="0",
                                                debt="0", alert_thresholds="",
                                                status="disabled"))
    assert response.status_code == 302, page_errors(response)
    rule.refresh_from_db()
    assert (rule.enabled, rule.mode) == (False, "shadow")
    assert admin_client.get(url).context["adminform"].form["status"].value() == "disabled"


def test_errors_name_the_field_in_the_kind_words(admin_client):
    response = admin_client.post(add_url("concurrency"), base_post(
        rate="0", period_s_0="30", period_s_1="second"))
    assert page_errors(response) == {"rate": ["Allow at least 1 request in flight."]}
    response = admin_client.post(add_url("calendar"), base_post(rate="5", debt="0",
                                                                alert_thresholds=""))
    assert page_errors(response) == {"calendar_period": [
        "Choose when the quota starts again: every day or every month."]}
    response = admin_client.post(add_url("token_bucket"), base_post(
        rate="5", period_s_0="", period_s_1="minute", burst="5", lease="0", debt="0",
        alert_thresholds=""))
    assert page_errors(response) == {"period_s": [
        "A token bucket needs its period: how often the requests refill."]}
    response = admin_client.post(add_url("token_bucket"), base_post(
        rate="5", period_s_0="400", period_s_1="day", burst="5", lease="0", debt="0",
        alert_thresholds=""))
    assert page_errors(response) == {"period_s": [
        "The period can be at most 366 days (31622400 seconds)."]}
    response = admin_client.post(add_url("failed_auth"), base_post(
        rate="10", period_s_0="1", period_s_1="minute", burst=""))
    assert page_errors(response) == {"burst": [
        "Give how many failed authentications in a row an address may have."]}
    assert not Rule.objects.exists()


def test_a_credits_allowance_of_zero_is_accepted(admin_client):
    response = admin_client.post(add_url("credits"), base_post(
        name="prepaid", rate="0", calendar_period="", debt="0", alert_thresholds=""))
    assert response.status_code == 302, page_errors(response)
    assert Rule.objects.get().describe() == \
        "prepaid credits only per user or API key, no allowance; enforced"


def preview(client, **params):
    response = client.get(reverse("admin:ratelimit_app_rule_preview"), params)
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    return response.json()


def test_the_preview_renders_what_was_typed_so_far(admin_client):
    assert preview(admin_client, kind="token_bucket", scope="ip", rate="20",
                   period_s_0="10", period_s_1="minute", burst="40")["words"] == \
        "20 requests per 10 minutes per client IP, bursts up to 40; enforced"
    assert preview(admin_client, kind="token_bucket", rate="20")["words"] == \
        "Type the numbers to read the rule in words."
    assert preview(admin_client, kind="concurrency", scope="tenant", rate="5",
                   period_s_0="2", period_s_1="minute", status="shadow")["words"] == \
        ("at most 5 requests in flight per tenant, a crashed request's slot freed after "
         "2 minutes; shadow (counted, never refused)")
    # input that does not parse is never guessed: it is said to be no number
    assert preview(admin_client, kind="token_bucket", rate="1e3", period_s_0="1",
                   period_s_1="minute", burst="5")["words"] == \
        "The rate is not a number: type it in digits, e.g. 60."
    response = admin_client.get(reverse("admin:ratelimit_app_rule_preview"), {"kind": "nope"})
    assert response.status_code == 400


# (a number field of a kind's form, what is typed in it): every kind, every number it shows
NOT_NUMBERS = [(key, field, typed) for key, kind in FORM_KINDS.items()
               for field, typed in (("rate", "²"), ("burst", "①"), ("period_s", "³"),
                                    ("rate", "-5"), ("burst", "9" * 40))
               if field in kind.form_fields]


@pytest.mark.parametrize("key, field, typed", NOT_NUMBERS)
def test_the_preview_says_a_number_in_other_digits_is_not_a_number(admin_client, key, field,
                                                                    typed):
    fields = {"rate": "20", "burst": "40", "period_s_0": "1", "period_s_1": "minute",
              "scope": "ip", "counted_statuses": "404", "calendar_period": "day"}
    name = "period" if field == "period_s" else field
    field = "period_s_0" if field == "period_s" else field
    answer = preview(admin_client, kind=key, **{**fields, field: typed})
    assert answer == {"words": f"The {name} is not a number: type it in digits, e.g. 60.",
                      "impact": ""}
    # the page's first render of a bound form says the same
    response = admin_client.post(add_url(key), base_post(**{**fields, field: typed}))
    assert answer["words"] in response.content.decode()


def test_the_preview_reads_digits_as_the_form_does(admin_client):
    # "１２" (fullwidth) is a number to int() and to the form's IntegerField: 12
    assert preview(admin_client, kind="token_bucket", scope="ip", rate="１２",
                   period_s_0="1", period_s_1="minute", burst="40")["words"] == \
        "12 requests per minute per client IP, bursts up to 40; enforced"


def test_the_preview_needs_the_view_permission(client, django_user_model):
    staff = django_user_model.objects.create_user("clerk", password="x", is_staff=True)
    client.force_login(staff)
    response = client.get(reverse("admin:ratelimit_app_rule_preview"), {"kind": "calendar"})
    assert response.status_code == 403


def test_the_plan_page_is_the_hub(admin_client, django_user_model):
    plan = Plan.objects.create(slug="pro", name="Pro")
    Rule.objects.create(name="pro-user", plan=plan, scope="user", rate=100, period_s=60,
                        burst=200)
    Rule.objects.create(name="everyone", scope="global", rate=1000, period_s=1, burst=1000)
    alice = django_user_model.objects.create_user("alice")
    PlanAssignment.objects.create(user=alice, plan=plan)
    ApiKey.create_key(alice, "ci", plan=plan)
    ApiKey.create_key(alice, "other")
    response = admin_client.get(reverse("admin:ratelimit_app_plan_change", args=[plan.pk]))
    hub = response.context["hub"]
    assert [line["words"] for line in hub["rules"]] == [
        "100 requests per minute per user or API key, bursts up to 200; enforced"]
    assert [line["rule"].name for line in hub["shared_rules"]] == ["everyone"]
    assert hub["rules"][0]["url"].endswith(f"?plan={plan.pk}")
    assert (hub["assignments"], hub["api_keys"]) == (1, 1)
    assert [link["label"] for link in hub["add_links"]] == \
        [kind.label for kind in FORM_KINDS.values()]
    html = response.content.decode()
    assert "1 user assigned" in html and "1 API key</a>" in html
    assert 'id="plan-traffic">Last hour: no requests.' in html


def test_a_rule_added_from_the_plan_page_returns_to_it(admin_client):
    plan = Plan.objects.create(slug="pro", name="Pro")
    response = admin_client.post(add_url("calendar", plan=plan.pk), base_post(
        plan=str(plan.pk), rate="10000", calendar_period="month", debt="0",
        alert_thresholds="", _save="Save"))
    assert response.status_code == 302, page_errors(response)
    assert response["Location"] == reverse("admin:ratelimit_app_plan_change", args=[plan.pk])


@pytest.mark.parametrize("key, fields, words", CASES)
def test_the_server_renders_the_word_cases(key, fields, words):
    """The table the browser test types into the forms, rendered by the server."""
    rule = rule_from_input(key, {"scope": "user", **as_form_data(fields)})
    assert (FORM_KINDS[key].sentence(rule) or PENDING) == words
    if words != PENDING:  # a saved row reads the same
        assert rule.describe() == words
    assert preview_words(key, fields) == words


def preview_words(key, fields):
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get_or_create(
        username="words", defaults={"is_staff": True, "is_superuser": True})[0])
    return preview(client, kind=key, **as_form_data(fields))["words"]


def test_new_numbers_are_measured_against_the_last_hour_heaviest_callers():
    """alice's free key spent 12 tokens in the last hour, an anonymous free caller 3: numbers
    allowing 6 an hour would have refused alice, not the other."""
    from django.test import Client

    from tests.helpers import limiter, load_demo_data

    load_demo_data()
    admin_client = Client()
    admin_client.force_login(get_user_model().objects.get(username="admin"))
    api = Client()
    for _ in range(12):
        assert api.get("/hello/", HTTP_X_API_KEY="rk_alice_free").status_code == 200
    for _ in range(3):
        assert api.get("/hello/", REMOTE_ADDR="198.51.100.9").status_code == 200
    limiter().flusher.flush_now()
    rule = Rule.objects.get(name="free-user")  # 60 per minute, bursts up to 30
    url = reverse("admin:ratelimit_app_rule_change", args=[rule.pk])
    numbers = {"kind": "token_bucket", "rule": rule.pk, "scope": "user", "rate": "1",
               "period_s_0": "1", "period_s_1": "hour", "burst": "5"}
    assert preview(admin_client, **numbers)["impact"] == (
        "Estimate: at least 1 of the 2 heaviest callers of the last hour would have been "
        "refused: each used more than the 6 tokens an hour the new numbers allow.")
    # alice's 12 tokens are just what 11 + 1 an hour allow: none refused
    assert preview(admin_client, **{**numbers, "burst": "11"})["impact"] == (
        "Estimate: none of the 2 heaviest callers of the last hour would have been refused; "
        "each used at most the 12 tokens an hour the new numbers allow.")
    # the saved numbers, unchanged: nothing to estimate
    same = {**numbers, "rate": "60", "period_s_0": "1", "period_s_1": "minute", "burst": "30"}
    assert preview(admin_client, **same)["impact"] == ""
    assert admin_client.get(url).status_code == 200
