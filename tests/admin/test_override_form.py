"""The identity override's form (admin/override_forms.py, IdentityOverrideAdmin): prefilled from
the query string, callers picked by search (autocomplete, no popup), a duration that ends from
the clock seam's now, the sentence on the page and from the preview endpoint (one source), the
list's sentences, and errors that say what to fix."""

import datetime
import re
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from ratelimit_app.admin.override_forms import override_from_input, override_words
from ratelimit_app.config.override_words import PENDING, moment_words
from ratelimit_app.models import ApiKey, IdentityOverride, Plan, PlanAssignment, Rule, Scope

from ..helpers import use_fake_clock

pytestmark = pytest.mark.django_db

ADD = "admin:ratelimit_callers_identityoverride_add"
NOW_MS = 1_796_000_000_000  # 2026-11-30 (UTC), the clock seam's now


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def bob():
    pro = Plan.objects.create(slug="pro", name="Pro")
    Plan.objects.create(slug="free", name="Free", default_for_authenticated=True)
    Rule.objects.create(name="pro-user", plan=pro, scope=Scope.USER, rate=600, period_s=60,
                        burst=200)
    Rule.objects.create(name="pro-plan", plan=pro, scope=Scope.PLAN, rate=9000, period_s=60,
                        burst=9000)
    user = User.objects.create(username="bob")
    PlanAssignment.objects.create(user=user, plan=pro)
    return user


def post_data(**fields):
    data = {"user": "", "api_key": "", "ip": "", "rule": "", "treatment": "factor",
            "factor": "2", "rate": "", "period_s_0": "", "period_s_1": "second", "burst": "",
            "duration_0": "", "duration_1": "day", "starts_at_0": "", "starts_at_1": "",
            "ends_at_0": "", "ends_at_1": "", "reason": ""}
    return {**data, **{name: str(value) for name, value in fields.items()}}


def errors(response):
    form = response.context["adminform"].form
    return {name: [str(m) for m in messages] for name, messages in form.errors.items()}


def test_the_add_page_is_prefilled_from_the_query_and_reads_as_a_sentence(admin_client, bob):
    rule = Rule.objects.get(name="pro-user")
    response = admin_client.get(reverse(ADD) + f"?user={bob.pk}&rule={rule.pk}")
    html = response.content.decode()
    form = response.context["adminform"].form
    assert form.initial["user"] == str(bob.pk) and form.initial["rule"] == str(rule.pk)
    assert response.context["override_words"] == \
        "bob: 1,200 requests per minute, bursts up to 400, with no end"
    assert response.context["rule_numbers_now"] == \
        "Now: pro-user, 600 requests per minute, bursts up to 200."
    # the caller is picked by search: Django's autocomplete, with bob chosen, and no popup
    user_select = re.search(r'<select name="user"[^>]*>', html).group(0)
    assert "admin-autocomplete" in user_select and 'data-model-name="identityoverride"' in \
        user_select
    assert f'<option value="{bob.pk}" selected>bob</option>' in html
    assert "related-lookup" not in html and "data-popup" not in html
    assert 'name="treatment" value="factor"' in html and 'value="2"' in html


def test_without_a_rule_the_sentence_spells_out_every_rule_of_the_callers_plan(admin_client,
                                                                              bob):
    Rule.objects.create(name="pro-ip", plan=bob.ratelimit_plan.plan, scope=Scope.IP, rate=10,
                        period_s=1, burst=20)
    Rule.objects.create(name="free-user", plan=Plan.objects.get(slug="free"), scope=Scope.USER,
                        rate=1, period_s=1, burst=1)
    response = admin_client.get(reverse(ADD) + f"?user={bob.pk}")
    assert response.context["override_words"] == (
        "bob: 20 requests per second, bursts up to 40 (pro-ip); 1,200 requests per minute, "
        "bursts up to 400 (pro-user), with no end")


def test_a_factor_for_7_days_ends_7_days_after_the_clock_seams_now(admin_client, bob):
    use_fake_clock(now_ms=NOW_MS)
    response = admin_client.post(reverse(ADD), post_data(user=bob.pk, duration_0=7,
                                                         reason="twice for a week"))
    assert response.status_code == 302
    override = IdentityOverride.objects.get()
    start = datetime.datetime.fromtimestamp(NOW_MS / 1000, tz=datetime.timezone.utc)
    assert (override.starts_at, override.ends_at) == (start, start + datetime.timedelta(days=7))
    assert (override.factor, override.exempt, override.rate) == (Decimal(2), False, None)
    assert override.reason == "twice for a week"


@pytest.mark.parametrize("unit, hours", [("hour", 12), ("day", 12 * 24), ("week", 12 * 168)])
def test_a_duration_is_a_number_and_a_unit(admin_client, bob, unit, hours):
    use_fake_clock(now_ms=NOW_MS)
    admin_client.post(reverse(ADD), post_data(user=bob.pk, duration_0=12, duration_1=unit))
    override = IdentityOverride.objects.get()
    assert override.ends_at - override.starts_at == datetime.timedelta(hours=hours)


def test_a_duration_counts_from_a_start_given_under_dates(admin_client, bob):
    admin_client.post(reverse(ADD), post_data(user=bob.pk, duration_0=2, starts_at_0="2027-01-10",
                                              starts_at_1="09:00:00"))
    override = IdentityOverride.objects.get()
    assert timezone.localtime(override.ends_at).strftime("%Y-%m-%d %H:%M") == "2027-01-12 09:00"


def test_a_duration_typed_on_a_dated_overrides_page_extends_it_from_now(admin_client, bob):
    clock = use_fake_clock(now_ms=NOW_MS)
    start = datetime.datetime.fromtimestamp(NOW_MS / 1000, tz=datetime.timezone.utc)
    override = IdentityOverride.objects.create(
        user=bob, factor=Decimal(2), starts_at=start, ends_at=start + datetime.timedelta(days=7))
    clock.advance(86400_000 * 5)  # five days on, two are left: three more days from now
    page = reverse("admin:ratelimit_callers_identityoverride_change", args=[override.pk])
    local = {name: timezone.localtime(getattr(override, name)) for name in ("starts_at",
                                                                           "ends_at")}
    dates = {f"{name}_{i}": local[name].strftime(form) for name in local
             for i, form in enumerate(("%Y-%m-%d", "%H:%M:%S"))}
    assert admin_client.post(page, post_data(user=bob.pk, duration_0=3, **dates)) \
        .status_code == 302
    override.refresh_from_db()
    assert override.starts_at == start
    assert override.ends_at == start + datetime.timedelta(days=5 + 3)


@pytest.mark.parametrize("fields, expected", [
    ({"factor": ""}, {"factor": ["Type the factor: 2 for twice the rule's limits, 0.5 for "
                                 "half."]}),
    ({"factor": "0"}, {"factor": ["The factor must be from 0.01 (a hundredth of the rule's "
                                  "numbers) to 1,000 (a thousand times)."]}),
    ({"treatment": "numbers", "rate": "5"}, {
        "period_s": ["Give the period, as a number and a unit."],
        "burst": ["Give the burst: the most the caller can spend at once."]}),
    ({"duration_0": "3", "ends_at_0": "2027-01-01", "ends_at_1": "00:00:00"},
     {"duration": ["Give a duration or an end under “Dates”, not both."]}),
    ({"duration_0": "400"}, {"duration": [
        "An override can last at most 366 days; for longer, leave the duration empty (until "
        "removed)."]}),
    ({"user": ""}, {"__all__": ["Choose exactly one of user, API key or client IP."]}),
    # what is typed in the fields of another treatment is neither kept nor an error
    ({"treatment": "exempt", "factor": "abc", "user": ""},
     {"__all__": ["Choose exactly one of user, API key or client IP."]}),
])
def test_errors_say_what_to_fix(admin_client, bob, fields, expected):
    response = admin_client.post(reverse(ADD), post_data(**{"user": bob.pk, **fields}))
    assert response.status_code == 200
    assert errors(response) == expected
    assert IdentityOverride.objects.count() == 0


def test_exempt_and_own_numbers_are_stored_without_a_factor(admin_client, bob):
    admin_client.post(reverse(ADD), post_data(user=bob.pk, treatment="exempt"))
    admin_client.post(reverse(ADD), post_data(ip="203.0.113.9", treatment="numbers", rate=5,
                                              period_s_0=1, period_s_1="minute", burst=9))
    exempt, own = IdentityOverride.objects.order_by("id")
    assert (exempt.exempt, exempt.factor) == (True, None)
    assert (own.exempt, own.factor, own.rate, own.period_s, own.burst) == \
        (False, None, 5, 60, 9)


def test_the_preview_says_what_the_page_says_as_it_is_typed(admin_client, bob):
    use_fake_clock(now_ms=NOW_MS)
    rule = Rule.objects.get(name="pro-user")
    url = reverse("admin:ratelimit_callers_identityoverride_preview")
    answer = admin_client.get(url, {"user": bob.pk, "rule": rule.pk, "treatment": "factor",
                                    "factor": "0.5", "duration_0": "7",
                                    "duration_1": "day"}).json()
    end = datetime.datetime.fromtimestamp(NOW_MS / 1000 + 7 * 86400, tz=datetime.timezone.utc)
    assert answer == {
        "words": f"bob: 300 requests per minute, bursts up to 100, until "
                 f"{moment_words(end, end)}",
        "impact": "Now: pro-user, 600 requests per minute, bursts up to 200."}
    assert admin_client.get(url, {"factor": "2"}).json()["words"] == PENDING
    assert admin_client.get(url, {"user": bob.pk, "treatment": "exempt"}).json()["words"] == \
        "bob: no limit at all (exempt from every rule), with no end"
    # the same function renders the page's first sentence
    typed = override_from_input({"user": str(bob.pk), "rule": str(rule.pk), "factor": "0.5",
                                 "treatment": "factor", "duration_0": "7"})
    assert override_words(typed)[0] == answer["words"]


def test_the_list_shows_each_override_as_a_sentence_with_its_end(admin_client, bob):
    rule = Rule.objects.get(name="pro-user")
    ends = timezone.now() + datetime.timedelta(days=3)
    IdentityOverride.objects.create(user=bob, rule=rule, factor=Decimal(2), ends_at=ends,
                                    reason="launch week")
    IdentityOverride.objects.create(ip="203.0.113.9", factor=Decimal("0.5"))
    html = admin_client.get(reverse("admin:ratelimit_callers_identityoverride_changelist")) \
        .content.decode()
    assert (f"bob: 1,200 requests per minute, bursts up to 400, until "
            f"{moment_words(ends, timezone.now())}</a>") in html
    assert '<td class="field-why">launch week</td>' in html
    assert "203.0.113.9: × 0.5 on every user, key or IP rule that applies, with no end" in html


def test_the_callers_autocomplete_finds_users_and_api_keys(admin_client, bob):
    ApiKey.create_key(bob, "ci", raw_key="rk_bobci_secret")
    url = reverse("admin:autocomplete")
    for field, term, found in (("user", "bo", "bob"), ("api_key", "rk_bob", "rk_bobci… (ci)")):
        answer = admin_client.get(url, {"app_label": "ratelimit_app",
                                        "model_name": "identityoverride",
                                        "field_name": field, "term": term}).json()
        assert [r["text"] for r in answer["results"]] == [found], field


def test_a_saved_overrides_page_shows_its_factor_and_treatment_as_typed(admin_client, bob):
    override = IdentityOverride.objects.create(user=bob, factor=Decimal("1.50"))
    page = admin_client.get(reverse("admin:ratelimit_callers_identityoverride_change",
                                    args=[override.pk]))
    form = page.context["adminform"].form
    assert form["factor"].value() == "1.5" and form["treatment"].value() == "factor"
    assert page.context["override_words"].startswith("bob: 900 requests per minute, bursts "
                                                     "up to 300")


@pytest.mark.parametrize("junk", ["abc", "²", "1.5"])
def test_a_caller_that_is_no_id_selects_nothing_instead_of_failing_the_page(admin_client, bob,
                                                                              junk):
    """A prefill or a post whose user or API key is not an id (a hand-edited link) gets the
    page, nothing chosen, and on save the picker's own error; never a 500."""
    for name in ("user", "api_key"):
        response = admin_client.get(reverse(ADD), {name: junk})
        assert response.status_code == 200
        select = re.search(rf'<select name="{name}".*?</select>', response.content.decode(),
                           re.S).group(0)
        assert "<option" in select and " selected" not in select
    response = admin_client.post(reverse(ADD), post_data(user=junk, duration_0=7))
    assert response.status_code == 200
    assert errors(response)["user"] == [
        "Select a valid choice. That choice is not one of the available choices."]
    assert not IdentityOverride.objects.exists()
