"""An endpoint cost is checked against the rules that charge it in tokens (config/models.py
``cost_limit``, ``EndpointCost.clean``): a token bucket's burst and a calendar quota's units per
period, never a credits rule (a balance has no burst) nor a concurrency limit (one slot per
request whatever its cost)."""

import pytest
from django.core.exceptions import ValidationError

from ratelimit_app.models import EndpointCost, Plan, Rule

pytestmark = pytest.mark.django_db


def rule(name, **fields):
    """Save a rule as the admin would (``full_clean`` first: it gives each kind its derived
    numbers, a credits rule's stored burst among them)."""
    made = Rule(name=name, scope="user", **fields)
    made.full_clean()
    made.save()
    return made


def cost_errors(cost, plan=None):
    """The errors of an endpoint cost of ``cost`` for api:reports (POST), or {} if valid."""
    row = EndpointCost(endpoint="api:reports", method="POST", cost=cost, plan=plan)
    try:
        row.full_clean()
    except ValidationError as exc:
        return exc.message_dict
    return {}


def test_a_credits_rule_without_allowance_accepts_any_cost():
    credits = rule("credits", kind="credits", rate=0)
    assert credits.burst == 1  # what it stores (the field wants 1): not a burst it enforces
    assert cost_errors(50) == {}


def test_a_concurrency_limit_accepts_a_cost_above_its_slots():
    rule("in-flight", kind="concurrency", rate=2, period_s=30)
    assert cost_errors(10) == {}


def test_a_token_bucket_refuses_a_cost_above_its_burst():
    rule("per-minute", rate=60, period_s=60, burst=5)
    assert cost_errors(5) == {}
    assert cost_errors(6) == {"cost": [
        "Rule “per-minute” has burst 5, below this cost: such requests could never pass. "
        "Lower the cost or raise that rule's burst."]}


def test_a_calendar_quota_refuses_a_cost_above_its_quota_in_its_words():
    rule("daily", kind="calendar", rate=4, calendar_period="day")
    assert cost_errors(4) == {}
    assert cost_errors(5) == {"cost": [
        "Rule “daily” is a quota of 4 units a day, below this cost: such requests could never "
        "pass. Lower the cost or raise that quota."]}


def test_the_tightest_rule_that_charges_the_cost_is_named_and_others_are_left_out():
    plan = Plan.objects.create(slug="team", name="Team")
    other = Plan.objects.create(slug="solo", name="Solo")
    rule("credits", kind="credits", rate=0)
    rule("in-flight", kind="concurrency", rate=1, period_s=30)
    rule("per-minute", rate=60, period_s=60, burst=8)
    rule("team-daily", plan=plan, kind="calendar", rate=6, calendar_period="day")
    rule("one-endpoint", endpoint="api:search", rate=60, period_s=60, burst=1)
    rule("off", rate=60, period_s=60, burst=2, enabled=False)
    assert cost_errors(7, other) == {}  # the team's quota does not charge other plans' costs
    for plan_of_cost in (plan, None):  # a cost for every plan is the team's too
        assert cost_errors(7, plan_of_cost)["cost"][0].startswith(
            "Rule “team-daily” is a quota of 6 units a day")
    assert cost_errors(9, other)["cost"][0].startswith("Rule “per-minute” has burst 8")
