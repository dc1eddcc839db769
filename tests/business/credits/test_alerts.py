"""Alerts on prepaid credits (business/credits/alerts.py): a credits rule's thresholds are percents
of an account's last top-up used, compared by the checkpoint of ``manage.py ratelimit rollup``
and stored through the quota alerts' rows, webhooks and signal (events ``credits.low`` and
``credits.exhausted``), once per account, threshold and top-up. Requests are real decisions on
the suite's redis-server; the checkpoint is the command's."""

import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import RequestFactory, TestCase

from ratelimit_app.business.credits.ledger import client_of, top_up
from ratelimit_app.models import (
    ApiKey,
    Plan,
    QuotaAlert,
    Rule,
    WebhookDelivery,
    WebhookEndpoint,
)

from ...helpers import limiter, use_fake_clock

pytestmark = pytest.mark.django_db


@pytest.fixture
def account():
    """A key on a plan whose credits rule alerts at 50 % and 100 % of the last top-up used, a
    webhook endpoint for the credits events; returns ``(raw key, account ref)``."""
    use_fake_clock()
    plan = Plan.objects.create(slug="prepaid", name="Prepaid", default_for_authenticated=True)
    rule = Rule(name="credits", plan=plan, scope="user", kind="credits", rate=0,
                alert_thresholds="100,50")
    rule.full_clean()
    rule.save()
    WebhookEndpoint.objects.create(name="billing", url="https://billing.example/hooks",
                                   events="credits.low,credits.exhausted")
    user = get_user_model().objects.create_user("payer")
    api_key, raw = ApiKey.create_key(user, "billing", plan=plan)
    return raw, f"key:{api_key.pk}"


def credit(ref, units, top_up_id):
    with TestCase.captureOnCommitCallbacks(execute=True):
        top_up(ref, units, top_up_id, actor="test", client=client_of(limiter().store))


def spend(raw, requests):
    request = RequestFactory().get("/", HTTP_X_API_KEY=raw)
    return [limiter().decide(request, None, "api").allowed for _ in range(requests)]


def roll_up():
    call_command("ratelimit", "rollup", stdout=io.StringIO())


def alerts():
    return [(a.event, a.threshold, a.used, a.limit) for a in QuotaAlert.objects.order_by("id")]


def test_the_thresholds_of_the_last_top_up_alert_once_each_with_their_webhooks(account):
    raw, ref = account
    credit(ref, 10, "payment-1")
    assert spend(raw, 4) == [True] * 4
    roll_up()
    assert alerts() == []  # 4 of 10 used: below 50 %
    spend(raw, 1)
    roll_up()
    roll_up()  # still past 50 %: stored once
    assert alerts() == [("credits.low", 50, 5, 10)]
    assert spend(raw, 6) == [True] * 5 + [False]
    roll_up()
    assert alerts() == [("credits.low", 50, 5, 10), ("credits.exhausted", 100, 10, 10)]
    deliveries = WebhookDelivery.objects.order_by("id")
    assert [d.event for d in deliveries] == ["credits.low", "credits.exhausted"]
    body = json.loads(deliveries[1].body)
    assert body["type"] == "credits.exhausted" and body["data"]["kind"] == "credits"
    assert body["data"]["identity"].startswith(ref)

    # a new top-up starts afresh: its own thresholds, its own alerts
    credit(ref, 4, "payment-2")
    roll_up()
    assert len(alerts()) == 2
    spend(raw, 2)
    roll_up()
    assert alerts()[-1] == ("credits.low", 50, 2, 4)


def test_units_left_from_earlier_top_ups_count_before_the_last_one(account):
    raw, ref = account
    credit(ref, 10, "payment-1")
    credit(ref, 4, "payment-2")  # 14 left: the last top-up is untouched until 10 are spent
    spend(raw, 11)  # 3 left: 1 of the last top-up's 4 used
    roll_up()
    assert alerts() == []
    spend(raw, 1)
    roll_up()
    assert alerts() == [("credits.low", 50, 2, 4)]


def test_the_request_path_does_not_alert_on_a_balance(account):
    raw, ref = account
    credit(ref, 2, "payment-1")
    assert limiter().snapshot().has_alerts is False  # only credits thresholds: nothing to do
    # with a quota that alerts beside it, the balance's levels are still not compared there
    Rule.objects.create(name="daily", kind="calendar", calendar_period="day", scope="user",
                        rate=100, burst=100, period_s=86400, alert_thresholds="1")
    limiter().bump_config_version()
    assert spend(raw, 2) == [True, True]
    limiter().alerts.drain()
    assert {a.rule.name for a in QuotaAlert.objects.all()} == {"daily"}
