"""Prepaid credits on the request path (decision/buckets.CreditBalance, take.lua's balances):
a request spends its cost from the caller's balance in the same atomic call as its buckets, is
refused 402 when the balance cannot pay, settles metered costs on it, and finds a balance Redis
lost rebuilt from the ledger. Through QuotaMiddleware and QuotaThrottle, against the suite's
real redis-server (and the real Cluster), at a test clock's time."""

import json

import pytest
from django.contrib.auth import get_user_model
from django.http import HttpResponse
from django.test import Client, TestCase
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.admin.dashboard.inspector import find_identity, reset_buckets
from ratelimit_app.business.credits.ledger import checkpoint, client_of, top_up
from ratelimit_app.business.usage.rollup import UsageRollup
from ratelimit_app.decision.balances import BalanceState, account_key
from ratelimit_app.models import (
    ApiKey,
    CreditAccount,
    EndpointCost,
    Plan,
    Rule,
    UsageRecord,
)

from ..helpers import limiter, use_fake_clock

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.runtime.test_credits")]

DAY_MS = 24 * 3600 * 1000


def ok(request):
    return HttpResponse("ok")


def metered(request):
    request.ratelimit.charge(int(request.GET["units"]))
    return HttpResponse("metered")


class DrfOk(APIView):
    permission_classes = [AllowAny]

    def get(self, request):
        return Response({"ok": True})


urlpatterns = [
    path("ok/", ok, name="ok"),
    path("search/", ok, name="search"),
    path("metered/", metered, name="metered"),
    path("drf/", DrfOk.as_view(), name="drf"),
]


# --- fixtures and helpers ----------------------------------------------------------------------

@pytest.fixture
def clock():
    return use_fake_clock()


@pytest.fixture
def paying(clock):
    """A plan whose callers spend prepaid credits (no allowance); an API key on it. Returns
    ``(raw key, account ref)``."""
    plan = Plan.objects.create(slug="prepaid", name="Prepaid", default_for_authenticated=True)
    credits_rule(plan)
    user = get_user_model().objects.create_user("payer")
    api_key, raw = ApiKey.create_key(user, "billing", plan=plan)
    return raw, f"key:{api_key.pk}"


def credits_rule(plan, *, allowance=0, refill="", debt=0, name="credits", shadow=False):
    rule = Rule(name=name, plan=plan, scope="user", kind="credits", rate=allowance,
                calendar_period=refill, debt=debt, mode="shadow" if shadow else "enforce")
    rule.full_clean()
    rule.save()
    return rule


def get(raw_key, url="/ok/"):
    return Client().get(url, HTTP_X_API_KEY=raw_key)


def credit(ref, units, top_up_id):
    """Top up, running what waits for the commit (the test's transaction never commits)."""
    with TestCase.captureOnCommitCallbacks(execute=True):
        return top_up(ref, units, top_up_id, actor="test", client=client_of(limiter().store))


def stored(ref, redis_client):
    # a metered request's settle is sent without waiting for its reply: once the reply is read
    # (as the connection's next call, or the metrics flush, does) it has applied
    limiter().store.collect_unanswered()
    return BalanceState.unpack(redis_client.get(account_key("rl", ref)))


# --- spending, refusing --------------------------------------------------------------------------

def test_a_balance_pays_each_request_its_cost_and_refuses_with_402_when_it_cannot(paying):
    raw, ref = paying
    refused = get(raw)
    # no top-up yet: the first request seeds the balance (0) from the ledger and is refused
    assert refused.status_code == 402
    body = json.loads(refused.content)
    assert body["status"] == 402 and body["title"] == "Payment Required"
    assert body["credits-exhausted"] == ["credits"]
    # waiting does not bring prepaid credits back: no Retry-After, and no RateLimit field for it
    assert "Retry-After" not in refused and "retry-after" not in body
    assert "credits" not in refused.get("RateLimit-Policy", "")

    credit(ref, 3, "payment-1")
    assert [get(raw).status_code for _ in range(4)] == [200, 200, 200, 402]
    account = CreditAccount.objects.get(ref=ref)
    assert account.granted == 3


def test_an_expensive_endpoint_spends_its_cost_and_a_request_the_balance_cannot_pay_spends_none(
        paying, redis_client):
    raw, ref = paying
    EndpointCost.objects.create(endpoint="search", cost=4)
    credit(ref, 10, "payment-1")
    assert get(raw, "/search/").status_code == 200
    assert get(raw, "/search/").status_code == 200
    assert get(raw, "/search/").status_code == 402  # 2 left, 4 asked: nothing taken
    assert stored(ref, redis_client).spent == 8
    assert [get(raw).status_code for _ in range(3)] == [200, 200, 402]


def test_the_balance_and_the_rate_limits_are_debited_all_or_nothing(paying, redis_client):
    raw, ref = paying
    plan = Plan.objects.get(slug="prepaid")
    Rule.objects.create(name="per-key", plan=plan, scope="user", rate=2, period_s=3600, burst=2)
    credit(ref, 1, "payment-1")
    assert get(raw).status_code == 200
    # the balance is empty: refused 402, and the rate limit keeps its token
    assert get(raw).status_code == 402
    credit(ref, 5, "payment-2")
    assert get(raw).status_code == 200  # the token the 402 did not take
    # the rate limit refuses now (429): the balance keeps its units
    refused = get(raw)
    assert refused.status_code == 429 and "Retry-After" in refused
    assert stored(ref, redis_client).spent == 2


def test_a_shadow_credits_rule_counts_but_never_refuses(clock, redis_client):
    plan = Plan.objects.create(slug="trial", name="Trial", default_for_authenticated=True)
    credits_rule(plan, shadow=True)
    user = get_user_model().objects.create_user("trier")
    api_key, raw = ApiKey.create_key(user, "trial", plan=plan)
    assert [get(raw).status_code for _ in range(2)] == [200, 200]
    assert stored(f"key:{api_key.pk}", redis_client).spent == 0


def test_the_drf_throttle_refuses_with_402_too(paying, settings):
    settings.REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES":
                               ["ratelimit_app.throttling.QuotaThrottle"]}
    raw, _ = paying
    refused = get(raw, "/drf/")
    assert refused.status_code == 402
    assert json.loads(refused.content)["credits-exhausted"] == ["credits"]


# --- the allowance ------------------------------------------------------------------------------

def test_a_daily_allowance_is_spent_first_and_is_whole_again_the_next_day(clock, redis_client):
    plan = Plan.objects.create(slug="daily", name="Daily", default_for_authenticated=True)
    credits_rule(plan, allowance=2, refill="day")
    user = get_user_model().objects.create_user("daily")
    api_key, raw = ApiKey.create_key(user, "daily", plan=plan)
    ref = f"key:{api_key.pk}"
    credit(ref, 1, "payment-1")
    assert [get(raw).status_code for _ in range(4)] == [200, 200, 200, 402]
    state = stored(ref, redis_client)
    assert (state.used, state.spent) == (3, 1)  # two from the allowance, one prepaid
    refused = get(raw)
    # the allowance comes back by itself: a Retry-After until the next day's start
    assert refused.status_code == 402 and 0 < int(refused["Retry-After"]) <= 24 * 3600 + 300

    clock.advance(DAY_MS)
    assert [get(raw).status_code for _ in range(3)] == [200, 200, 402]
    assert stored(ref, redis_client).spent == 1


def test_a_never_refilled_allowance_is_given_once(clock):
    plan = Plan.objects.create(slug="starter", name="Starter", default_for_authenticated=True)
    credits_rule(plan, allowance=2)
    user = get_user_model().objects.create_user("starter")
    _, raw = ApiKey.create_key(user, "starter", plan=plan)
    assert [get(raw).status_code for _ in range(3)] == [200, 200, 402]
    clock.advance(400 * DAY_MS)
    assert get(raw).status_code == 402


# --- metered costs --------------------------------------------------------------------------------

def test_a_metered_request_is_settled_on_the_balance_down_to_its_debt(clock, redis_client):
    plan = Plan.objects.create(slug="metered", name="Metered", default_for_authenticated=True)
    credits_rule(plan, debt=5)
    EndpointCost.objects.create(endpoint="metered", cost=10, metered=True, minimum=1)
    user = get_user_model().objects.create_user("metered")
    api_key, raw = ApiKey.create_key(user, "metered", plan=plan)
    ref = f"key:{api_key.pk}"
    credit(ref, 30, "payment-1")

    assert get(raw, "/metered/?units=3").status_code == 200  # 10 held, 7 given back
    assert stored(ref, redis_client).spent == 3
    assert get(raw, "/metered/?units=25").status_code == 200  # 15 more than the estimate
    assert stored(ref, redis_client).spent == 28
    # 2 left, 30 consumed: charged down to the debt bound (-5), what goes further is not
    assert get(raw, "/metered/?units=30").status_code == 402  # 2 left, estimate 10
    credit(ref, 10, "payment-2")  # 12 left
    assert get(raw, "/metered/?units=30").status_code == 200
    state = stored(ref, redis_client)
    assert state.granted - state.spent == -5  # no allowance: the prepaid units left
    assert get(raw).status_code == 402


def test_usage_records_bill_what_the_balance_was_charged_not_what_was_reported(clock):
    plan = Plan.objects.create(slug="billed", name="Billed", default_for_authenticated=True)
    credits_rule(plan, debt=5)
    EndpointCost.objects.create(endpoint="metered", cost=10, metered=True, minimum=1)
    user = get_user_model().objects.create_user("billed")
    api_key, raw = ApiKey.create_key(user, "billed", plan=plan)
    credit(f"key:{api_key.pk}", 14, "payment-1")
    assert get(raw, "/metered/?units=4").status_code == 200   # 10 held, 6 given back: 4
    assert get(raw, "/metered/?units=90").status_code == 200  # 10 left: down to -5, 15 paid
    limiter().flusher.flush_now()
    UsageRollup(limiter().store.metrics_client()).run()
    record = UsageRecord.objects.get(rule="credits")
    assert (record.units, record.allowed) == (4 + 15, 2)


# --- the ledger behind the balance ----------------------------------------------------------------

def test_a_balance_redis_lost_is_rebuilt_from_the_ledger_and_its_last_checkpoint(
        paying, redis_client):
    raw, ref = paying
    credit(ref, 10, "payment-1")
    assert [get(raw).status_code for _ in range(4)] == [200] * 4
    checkpoint(client_of(limiter().store))
    assert CreditAccount.objects.get(ref=ref).spent == 4
    assert get(raw).status_code == 200  # spent after the checkpoint: what a loss can lose

    redis_client.delete(account_key("rl", ref))  # a flush, a restart without persistence
    assert [get(raw).status_code for _ in range(7)] == [200] * 6 + [402]
    # rebuilt from the ledger: 10 granted - 4 checkpointed; the one after the checkpoint was
    # paid twice (the bound the docs state: consumption since the last checkpoint)
    assert stored(ref, redis_client).spent == 10


def test_a_top_up_applies_at_once_to_a_balance_in_redis(paying, redis_client):
    raw, ref = paying
    assert get(raw).status_code == 402  # seeded at 0
    credit(ref, 2, "payment-1")
    assert stored(ref, redis_client).granted == 2
    assert [get(raw).status_code for _ in range(3)] == [200, 200, 402]
    # a retried payment credits nothing more
    _, created = credit(ref, 2, "payment-1")
    assert not created and get(raw).status_code == 402


def test_without_the_ledger_a_missing_balance_follows_the_rule_fail_mode(paying, redis_client,
                                                                         monkeypatch):
    raw, ref = paying
    Rule.objects.filter(name="credits").update(on_redis_failure="closed")
    limiter().bump_config_version()

    def no_database(*args, **kwargs):
        raise RuntimeError("the database is down")

    monkeypatch.setattr("ratelimit_app.business.credits.ledger.seed", no_database)
    refused = get(raw)
    # no balance, no decision on it: the rule's fail mode (closed here), as without Redis
    assert refused.status_code == 429
    assert json.loads(refused.content)["title"] == "Temporarily reduced capacity"
    assert redis_client.get(account_key("rl", ref)) is None


def test_resetting_a_callers_buckets_keeps_its_balance(paying, redis_client):
    raw, ref = paying
    plan = Plan.objects.get(slug="prepaid")
    Rule.objects.create(name="per-key", plan=plan, scope="user", rate=1, period_s=3600, burst=1)
    credit(ref, 5, "payment-1")
    assert [get(raw).status_code for _ in range(2)] == [200, 429]
    snapshot = limiter().snapshot()
    deleted, _ = reset_buckets(find_identity(ref, snapshot).identity, snapshot)
    # the per-key bucket is full again; the balance still has the unit spent taken off
    assert deleted == 1 and stored(ref, redis_client) == BalanceState(5, 1, 1, 0, 1)
    assert get(raw).status_code == 200 and stored(ref, redis_client).spent == 2


# --- on a Redis Cluster ---------------------------------------------------------------------------

@pytest.fixture
def cluster_paying(cluster):
    """``paying`` on the session's Cluster, with a global rule whose key is in another slot
    than the key's balance (so a decision is two atomic calls, one per slot group)."""
    use_fake_clock()
    plan = Plan.objects.create(slug="prepaid", name="Prepaid", default_for_authenticated=True)
    credits_rule(plan)
    Rule.objects.create(name="everyone", scope="global", rate=1, period_s=3600, burst=2)
    user = get_user_model().objects.create_user("payer")
    api_key, raw = ApiKey.create_key(user, "billing", plan=plan)
    ref = f"key:{api_key.pk}"
    assert cluster.slot_of(account_key("rl", ref)) != cluster.slot_of("rl:{global}")
    return raw, ref


def test_on_a_cluster_a_missing_balance_is_seeded_and_the_other_slot_charged_once(
        cluster, cluster_paying):
    raw, ref = cluster_paying
    client = cluster.client()
    credit(ref, 5, "payment-1")
    # the first decision found the balance missing in its slot while the global bucket's slot
    # debited: that debit was given back, the balance seeded, the decision made again
    assert get(raw).status_code == 200
    assert BalanceState.unpack(client.get(account_key("rl", ref))).spent == 1
    assert get(raw).status_code == 200  # the global bucket's second token: none was lost
    assert get(raw).status_code == 429  # the global bucket, empty now


def test_on_a_cluster_a_refusal_in_another_slot_gives_the_credits_back(cluster, cluster_paying):
    raw, ref = cluster_paying
    client = cluster.client()
    credit(ref, 5, "payment-1")
    assert [get(raw).status_code for _ in range(3)] == [200, 200, 429]
    # the third request's debit of the balance (its slot allowed it) was refunded by refund.lua
    assert BalanceState.unpack(client.get(account_key("rl", ref))).spent == 2
    # and the other way round: the balance refuses, the global bucket keeps its token
    Rule.objects.filter(name="everyone").update(burst=100)
    limiter().bump_config_version()
    client.delete("rl:{global}")  # full again, at its new burst
    assert [get(raw).status_code for _ in range(4)] == [200, 200, 200, 402]
    assert BalanceState.unpack(client.get(account_key("rl", ref))).spent == 5


# --- the async path ------------------------------------------------------------------------------

def test_an_async_decision_seeds_a_missing_balance_in_a_thread_and_spends_it(paying,
                                                                            redis_client):
    from asgiref.sync import async_to_sync
    from django.test import RequestFactory

    raw, ref = paying
    credit(ref, 2, "payment-1")
    request = RequestFactory().get("/ok/", HTTP_X_API_KEY=raw)

    async def decide():
        """One decision in a fresh event loop, whose connections it closes."""
        try:
            return await limiter().adecide(request, None, "ok")
        finally:
            await limiter().async_store().aclose()

    outcomes = [async_to_sync(decide)() for _ in range(3)]
    assert [d.allowed for d in outcomes] == [True, True, False]
    assert outcomes[2].out_of_credits == ("credits",)
    assert stored(ref, redis_client).spent == 2


def test_a_credits_rule_without_allowance_validates_again_once_saved(paying):
    rule = Rule.objects.get(name="credits")
    rule.full_clean()  # what an export read back, or an admin save, runs
    assert rule.rate == 0
