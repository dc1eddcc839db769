"""The rows of metered costs (``EndpointCost.metered`` and ``minimum``, ``Rule.debt``): what
their validation refuses, what the compiled snapshot answers, and that quotas as code carry
them."""

import pytest
from django.core.exceptions import ValidationError

from ratelimit_app.config.compiler import compile_snapshot
from ratelimit_app.config.quotas_as_code import apply_import, export_document, plan_import
from ratelimit_app.models import EndpointCost, Kind, Plan, Rule

pytestmark = pytest.mark.django_db


@pytest.fixture
def plans():
    return (Plan.objects.create(slug="free", name="Free"),
            Plan.objects.create(slug="pro", name="Pro"))


def errors_of(row):
    with pytest.raises(ValidationError) as raised:
        row.full_clean()
    return raised.value.message_dict


def test_a_minimum_needs_a_metered_row_and_no_more_than_the_estimate():
    assert "tick “metered”" in errors_of(EndpointCost(endpoint="chat", cost=5, minimum=1))["minimum"][0]
    assert "above the estimate (5)" in \
        errors_of(EndpointCost(endpoint="chat", cost=5, metered=True, minimum=6))["minimum"][0]
    EndpointCost(endpoint="chat", cost=5, metered=True, minimum=5).full_clean()


def test_debt_is_for_buckets_and_quotas_that_count_requests():
    concurrency = Rule(name="jobs", scope="user", kind=Kind.CONCURRENCY, rate=2, period_s=30,
                       debt=5)
    assert "set it to 0" in errors_of(concurrency)["debt"][0]
    failed_auth = Rule(name="guesses", scope="ip", counts="failed_auth", rate=1, period_s=60,
                       burst=10, debt=5)
    assert "set it to 0" in errors_of(failed_auth)["debt"][0]
    huge = Rule(name="huge", scope="user", rate=1, period_s=10**7, burst=1, debt=10**9)
    assert "Debt × period is too large" in errors_of(huge)["debt"][0]
    Rule(name="units", scope="user", rate=1, period_s=60, burst=100, debt=100).full_clean()


def test_the_snapshot_knows_which_requests_are_metered_as_it_knows_their_cost(plans):
    free, pro = plans
    EndpointCost.objects.create(endpoint="chat", cost=50, metered=True, minimum=1)
    EndpointCost.objects.create(endpoint="chat", plan=pro, cost=20)   # pro: a fixed cost
    EndpointCost.objects.create(endpoint="chat", method="POST", cost=80, metered=True, minimum=3)
    rule = Rule.objects.create(name="units", scope="user", rate=1, period_s=60, burst=100,
                               debt=40)
    snapshot = compile_snapshot("1", 0.0)
    assert (snapshot.cost_for("chat", "GET", "free"),
            snapshot.minimum_if_metered("chat", "GET", "free")) == (50, 1)
    assert (snapshot.cost_for("chat", "GET", "pro"),
            snapshot.minimum_if_metered("chat", "GET", "pro")) == (20, None)
    assert snapshot.minimum_if_metered("chat", "POST", "free") == 3
    assert snapshot.minimum_if_metered("other", "GET", "free") is None
    assert [r.debt for r in snapshot.rules if r.id == rule.id] == [40]


def test_without_a_metered_row_the_snapshot_has_nothing_to_look_up(plans):
    EndpointCost.objects.create(endpoint="chat", cost=50)
    assert compile_snapshot("1", 0.0).metering == {}


def test_quotas_as_code_carry_the_metered_fields(plans):
    EndpointCost.objects.create(endpoint="chat", cost=50, metered=True, minimum=2)
    Rule.objects.create(name="units", scope="user", rate=1, period_s=60, burst=100, debt=40)
    document = export_document()
    [cost] = document["endpoint_costs"]
    [rule] = document["rules"]
    assert (cost["metered"], cost["minimum"], rule["debt"]) == (True, 2, 40)
    cost["minimum"], rule["debt"] = 5, 10
    apply_import(plan_import(document).changes)
    assert EndpointCost.objects.get().minimum == 5 and Rule.objects.get().debt == 10
