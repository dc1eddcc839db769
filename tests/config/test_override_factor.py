"""An override's factor (config/factors.py, engine.with_override_numbers): the numbers a caller
gets are the rule's own in force × the factor, for a token bucket, a calendar quota and a
concurrency limit, for the rule it names or every rule that applies, following the rule when
it is edited; and its validation."""

import json
from decimal import Decimal

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError

from ratelimit_app.config import audit, quotas_as_code
from ratelimit_app.config.compiler import compile_snapshot
from ratelimit_app.config.factors import parse_factor, scaled, scaled_limits
from ratelimit_app.models import AuditEntry, IdentityOverride, Kind, Plan, Rule, Scope

from ..helpers import decide, limiter
from .test_policy import T0, add_plan, add_rule, add_user, request_from

pytestmark = pytest.mark.django_db

IP = "198.51.100.9"


def policies(user=None, ip=IP, endpoint="api:items"):
    """Decide one request; return {policy name: (quota, window_s, burst)}."""
    decision = decide(request_from(ip), user or AnonymousUser(), endpoint, now_ms=T0)
    return {p.name: (p.quota, p.window_s, p.burst) for p in decision.policies}


def test_the_arithmetic_is_decimal_rounded_half_up_never_below_1_nor_above_the_most():
    assert scaled(100, Decimal("0.29"), 10**6) == 29  # a float's 28.999… would round down
    assert scaled(3, Decimal("0.5"), 10**6) == 2      # 1.5: half up
    assert scaled(1, Decimal("0.1"), 10**6) == 1      # never below 1
    assert scaled(10**6, Decimal("1000"), 5) == 5
    # a token bucket's burst stays within what a bucket of its period holds (2**50 units)
    rate, burst = scaled_limits(Decimal("1000"), rate=10, period_s=366 * 86400, burst=10**6)
    assert (rate, burst) == (10_000, 2**50 // (366 * 86400 * 1000))
    assert scaled_limits(Decimal(2), rate=500, period_s=86400, burst=500, calendar=True) == \
        (1000, 1000)
    assert [parse_factor(t) for t in ("2", " 0.5 ", "1,5", "×2", "x3", "two", "", "nan")] == \
        [Decimal(2), Decimal("0.5"), Decimal("1.5"), Decimal(2), Decimal(3), None, None, None]


def test_a_factor_scales_the_rate_and_burst_of_the_token_bucket_it_names():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, rate=600, period_s=60, burst=200)
    other = add_rule("free-ip-search", free, scope=Scope.IP, rate=10, period_s=60, burst=10)
    IdentityOverride.objects.create(ip=IP, rule=Rule.objects.get(name="free-ip"),
                                    factor=Decimal(2))
    assert policies() == {"free-ip": (1200, 60, 400), "free-ip-search": (10, 60, 10)}
    # another caller keeps the rule's own numbers
    assert policies(ip="198.51.100.10")["free-ip"] == (600, 60, 200)
    assert other.pk  # (named, so the override's rule is one of two)


def test_without_a_rule_a_factor_scales_every_user_and_ip_rule_of_the_caller_but_no_shared_one():
    pro = add_plan("pro", default_for_authenticated=True)
    add_rule("pro-user", pro, rate=600, period_s=60, burst=200)
    add_rule("pro-ip", pro, scope=Scope.IP, rate=100, period_s=1, burst=50)
    add_rule("pro-plan", pro, scope=Scope.PLAN, rate=5000, period_s=60, burst=5000)
    bob = add_user("bob", pro)
    IdentityOverride.objects.create(user=bob, factor=Decimal("0.5"))
    assert policies(bob) == {"pro-plan": (5000, 60, 5000), "pro-user": (300, 60, 100),
                             "pro-ip": (50, 1, 25)}


def test_a_factor_scales_a_calendar_quota_and_a_concurrency_limit():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("daily", free, scope=Scope.IP, rate=500, kind=Kind.CALENDAR, calendar_period="day",
             period_s=86400, burst=500)
    add_rule("inflight", free, scope=Scope.IP, rate=5, kind=Kind.CONCURRENCY, period_s=30,
             burst=5)
    IdentityOverride.objects.create(ip=IP, factor=Decimal("1.5"))
    found = policies()
    assert found["daily"][0] == found["daily"][2] == 750
    assert found["inflight"][0] == found["inflight"][2] == 8  # 7.5, half up


def test_own_numbers_still_replace_a_token_bucket_and_leave_a_calendar_quota_alone():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, rate=600, period_s=60, burst=200)
    add_rule("daily", free, scope=Scope.IP, rate=500, kind=Kind.CALENDAR, calendar_period="day",
             period_s=86400, burst=500)
    IdentityOverride.objects.create(ip=IP, rate=5, period_s=30, burst=7)
    found = policies()
    assert found["free-ip"] == (5, 30, 7) and found["daily"][0] == 500


def test_the_last_override_wins_and_a_factor_scales_the_rule_not_an_override_before_it():
    free = add_plan("free", default_for_anonymous=True)
    rule = add_rule("free-ip", free, scope=Scope.IP, rate=100, period_s=60, burst=100)
    IdentityOverride.objects.create(ip=IP, rule=rule, factor=Decimal(2))
    IdentityOverride.objects.create(ip=IP, rule=rule, factor=Decimal(3),
                                    ends_at="2099-01-01T00:00:00Z")
    # the dated one (applied last): 3 × the rule's 100, not 3 × the permanent one's 200
    assert policies()["free-ip"] == (300, 60, 300)


def test_a_factor_follows_the_rule_when_the_rule_is_edited(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_CHECK_INTERVAL_S": 0}
    free = add_plan("free", default_for_anonymous=True)
    rule = add_rule("free-ip", free, scope=Scope.IP, rate=600, period_s=60, burst=200)
    IdentityOverride.objects.create(ip=IP, rule=rule, factor=Decimal(2))
    assert policies()["free-ip"] == (1200, 60, 400)
    rule.rate, rule.burst, rule.period_s = 60, 30, 1
    rule.save()
    limiter().bump_config_version()  # what the on_commit hook does after a real commit
    assert policies()["free-ip"] == (120, 1, 60)


def test_the_snapshot_holds_the_factor_and_an_edit_of_the_rule_alone_keeps_it():
    free = add_plan("free", default_for_anonymous=True)
    rule = add_rule("free-ip", free, scope=Scope.IP, rate=600, period_s=60, burst=200)
    IdentityOverride.objects.create(ip=IP, rule=rule, factor=Decimal("2.5"))
    base = compile_snapshot("v1")
    entry, = base.overrides[("ip", IP)]
    assert entry.factor == Decimal("2.5") and entry.rate is None
    # a compile of the edited rule alone keeps the overrides part, and the factor applies to
    # the rule's new numbers
    Rule.objects.filter(pk=rule.pk).update(rate=10)
    patched = compile_snapshot("v2", base=base, changed={f"rule:{rule.pk}"})
    assert patched.overrides is base.overrides
    scaled_rule = patched.rules[0].scaled(entry.factor)
    assert (scaled_rule.rate, scaled_rule.period_s, scaled_rule.burst) == (25, 60, 500)


@pytest.mark.parametrize("fields, errors", [
    ({"factor": Decimal("0")}, {"factor": ["The factor must be from 0.01 (a hundredth of the "
                                           "rule's numbers) to 1,000 (a thousand times)."]}),
    ({"factor": Decimal("1000.01")}, None),
    ({"factor": Decimal("2"), "rate": 5, "period_s": 60, "burst": 5},
     {"__all__": ["Give either a factor of the rule's numbers or numbers of its own, not "
                  "both: clear rate, period and burst, or the factor."]}),
    ({"factor": Decimal("2"), "exempt": True},
     {"__all__": ["An exempt caller has no numbers; clear the factor, rate, period and "
                  "burst."]}),
    ({}, {"__all__": ["Give a factor of the rule's numbers (e.g. 2), or tick “exempt”, or "
                      "give rate, period and burst."]}),
])
def test_validation_says_what_to_fix(fields, errors):
    override = IdentityOverride(ip=IP, **fields)
    with pytest.raises(ValidationError) as error:
        override.full_clean()
    if errors is None:  # Django's own words for the field's digits, or ours for the range
        assert list(error.value.message_dict) == ["factor"]
    else:
        assert error.value.message_dict == errors


def test_a_factor_is_refused_on_prepaid_credits_and_own_numbers_on_a_calendar_quota():
    plan = Plan.objects.create(slug="p", name="P")
    credits = Rule.objects.create(name="credits", plan=plan, scope=Scope.USER, kind=Kind.CREDITS,
                                  rate=10, period_s=60, burst=10)
    daily = Rule.objects.create(name="daily", plan=plan, scope=Scope.USER, kind=Kind.CALENDAR,
                                calendar_period="day", rate=10, period_s=86400, burst=10)
    with pytest.raises(ValidationError) as error:
        IdentityOverride(ip=IP, rule=credits, factor=Decimal(2)).full_clean()
    assert error.value.message_dict["rule"][0].startswith("Prepaid credits are a balance")
    with pytest.raises(ValidationError) as error:
        IdentityOverride(ip=IP, rule=daily, rate=1, period_s=60, burst=1).full_clean()
    assert error.value.message_dict["rule"] == [
        "A calendar quota has no rate, period and burst to override; give a factor of its "
        "limit instead (or tick “exempt”)."]
    IdentityOverride(ip=IP, rule=daily, factor=Decimal(2)).full_clean()  # a factor is fine


# --- quotas as code and the audit trail ----------------------------------------------------------

def factor_rows():
    free = add_plan("free", default_for_anonymous=True)
    rule = add_rule("free-ip", free, scope=Scope.IP, rate=600, period_s=60, burst=200)
    IdentityOverride.objects.create(ip=IP, rule=rule, factor=Decimal(2), reason="launch")
    IdentityOverride.objects.create(ip="198.51.100.10", factor=Decimal("0.5"))
    return rule


def test_a_factor_is_exported_as_a_number_and_imported_back_unchanged():
    factor_rows()
    document = quotas_as_code.export_document()
    assert sorted(o["factor"] for o in document["identity_overrides"]) == [0.5, 2]
    assert quotas_as_code.plan_import(json.loads(quotas_as_code.dumps(document))).changes == []
    # a new factor is a change of that field alone, stored as the admin stores it
    item = next(o for o in document["identity_overrides"] if o["ip"] == IP)
    item["factor"] = 1.25
    plan = quotas_as_code.plan_import(document)
    assert [c.fields for c in plan.changes] == [[("factor", 2, 1.25)]]
    quotas_as_code.apply_import(plan.changes)
    assert IdentityOverride.objects.get(ip=IP).factor == Decimal("1.25")


@pytest.mark.parametrize("factor, message", [
    (0.125, "factor: Ensure that there are no more than 2 decimal places."),
    (0, "factor: The factor must be from 0.01"),
    ("2", "factor: must be a number, not “2”."),
])
def test_an_imported_factor_is_refused_in_the_admins_words(factor, message):
    factor_rows()
    document = quotas_as_code.export_document()
    document["identity_overrides"][0]["factor"] = factor
    with pytest.raises(quotas_as_code.QuotaFileError) as error:
        quotas_as_code.plan_import(document)
    assert len(error.value.errors) == 1 and message in error.value.errors[0]


def test_a_file_written_before_the_merge_has_its_note_read_into_the_reason():
    factor_rows()
    document = quotas_as_code.export_document()
    for item in document["identity_overrides"]:
        item.pop("factor")  # (a file of then: no factor, its own numbers, a note)
        item["rate"], item["period_s"], item["burst"] = 5, 60, 5
    notes = {"198.51.100.10": "ticket 4711", IP: "extended"}
    for item in document["identity_overrides"]:
        item["note"] = notes[item["ip"]]
    quotas_as_code.apply_import(quotas_as_code.plan_import(document).changes)
    assert dict(IdentityOverride.objects.values_list("ip", "reason")) == {
        "198.51.100.10": "ticket 4711", IP: "launch — extended"}
    assert quotas_as_code.merged_text("launch", "ticket 4711") == "launch — ticket 4711"
    assert quotas_as_code.merged_text("", "ticket") == "ticket"
    assert quotas_as_code.merged_text("same", "same") == "same"


@pytest.mark.django_db(transaction=True)  # (entries are recorded when a transaction commits)
def test_the_audit_trail_records_a_factor_and_restores_it():
    rule = factor_rows()
    override = IdentityOverride.objects.get(ip=IP)
    before = AuditEntry.objects.order_by("-id").first()
    override.factor = Decimal(3)
    override.save()
    assert AuditEntry.objects.order_by("-id").first().summary == \
        f"identity override (ip {IP}, rule {rule.name}): factor 2 → 3"
    plan = audit.restore_plan(before)
    assert [c.fields for c in plan.changes] == [[("factor", 3, 2)]]
