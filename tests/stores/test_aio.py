"""``Limiter.adecide`` and the async stores (stores/aio.py), in process, against the suite's
redis-server: one EVALSHA per decision on the asyncio client, all-or-nothing, NOSCRIPT handled,
the breaker shared with the sync path, the snapshot loaded off the loop only when it must be.

Each call runs in ``async_to_sync`` from the test's thread (as Django runs async code for a sync
caller), so the ORM work the async path hands to a thread sees the test's database.
"""

from types import SimpleNamespace

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

from ratelimit_app.metrics import WAIT_BATCH
from ratelimit_app.models import FailureMode, Plan, Rule, Scope
from ratelimit_app.runtime import guard
from ratelimit_app.stores import RedisStore
from ratelimit_app.stores.aio import (
    AsyncRedisStore,
    AsyncWireStore,
    ThreadedAsyncStore,
    async_store_for,
)

from ..helpers import limiter

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "BREAKER_FAILURES": 2,
                              "BREAKER_COOLDOWN_S": 3600, "CONFIG_CHECK_INTERVAL_S": 3600,
                              "LOCAL_DENY_CACHE": False}  # every decision asks Redis
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="ip", plan=plan, scope=Scope.IP, rate=1, period_s=3600, burst=3)
    Rule.objects.create(name="hello", plan=plan, scope=Scope.IP, endpoint="hello", rate=1,
                        period_s=3600, burst=10, on_redis_failure=FailureMode.CLOSED)
    return plan


def adecide(endpoint="hello", ip="192.0.2.10"):
    """One decision on the async path, in a fresh event loop whose connections it closes."""
    request = RequestFactory().get("/", REMOTE_ADDR=ip)

    async def run():
        try:
            return await limiter().adecide(request, AnonymousUser(), endpoint)
        finally:
            await limiter().async_store().aclose()

    return async_to_sync(run)()


def test_one_evalsha_per_decision_and_all_or_nothing(rules, redis_server):
    adecide(ip="192.0.2.99")  # the snapshot, loaded in a thread on first use
    before = redis_server.command_calls("evalsha")
    decisions = [adecide() for _ in range(5)]
    assert redis_server.command_calls("evalsha") - before == 5
    assert [d.allowed for d in decisions] == [True, True, True, False, False]
    assert decisions[4].violated == ("ip",)
    # the refused requests debited nothing: the hello bucket still holds 10 - 3
    assert {p.name: p.remaining for p in decisions[4].policies} == {"ip": 0, "hello": 7}
    # the sync path sees the same buckets
    sync = limiter().decide(RequestFactory().get("/", REMOTE_ADDR="192.0.2.10"),
                            AnonymousUser(), "hello")
    assert not sync.allowed and sync.violated == ("ip",)


def test_noscript_after_a_script_flush_is_handled(rules, redis_client):
    assert adecide().allowed
    redis_client.script_flush()
    decision = adecide(ip="192.0.2.11")
    assert decision.allowed and not decision.degraded


def test_the_breaker_and_counters_are_shared_with_the_sync_path(rules, redis_server):
    assert adecide().allowed
    redis_server.kill()
    answers = [adecide(ip=f"192.0.2.{20 + i}") for i in range(3)]
    # fail modes: the hello rule fails closed
    assert [d.allowed for d in answers] == [False, False, False]
    assert all(d.degraded for d in answers)
    stats, breaker = limiter().stats, limiter().breaker
    assert stats.redis_errors == 2 and stats.breaker_skips == 1
    assert breaker.state == breaker.OPEN
    # the sync path does not try Redis either while the breaker the async path opened is open
    limiter().decide(RequestFactory().get("/", REMOTE_ADDR="192.0.2.30"), AnonymousUser(),
                     "hello")
    assert stats.breaker_skips == 2


def test_the_snapshot_is_loaded_off_the_loop_only_when_needed(rules, monkeypatch):
    loads = []
    policies = limiter().policies
    real_get = policies.get
    monkeypatch.setattr(policies, "get", lambda: loads.append(1) or real_get())
    adecide()
    adecide(ip="192.0.2.12")
    assert len(loads) == 1  # the first request's load; then the snapshot in memory
    policies.invalidate()  # what a new config version in a reply does
    adecide(ip="192.0.2.13")
    assert len(loads) == 2


def test_failed_authentication_on_the_async_path(rules):
    Rule.objects.create(name="auth", plan=None, scope=Scope.IP, counts="failed_auth", rate=1,
                        period_s=3600, burst=2)
    request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.40")

    async def charge():
        try:
            return await limiter().protection.afailed_authentication(request, "hello")
        finally:
            await limiter().async_store().aclose()

    assert [async_to_sync(charge)().allowed for _ in range(3)] == [True, True, False]


def test_the_async_store_of_each_kind(settings):
    store = limiter().store
    assert type(store) is RedisStore
    built = async_store_for(store)
    assert isinstance(built, AsyncWireStore)
    kwargs = store.client.connection_pool.connection_kwargs
    assert built._wire_options["address"] == (kwargs["host"], kwargs["port"])
    assert built._wire_options["timeout_s"] == kwargs["socket_timeout"]
    # a connection the wire does not speak (TLS, a credential provider): redis.asyncio
    fallback = AsyncRedisStore.like(store.client)
    assert fallback._connection_kwargs["port"] == kwargs["port"]
    assert fallback._connection_kwargs["socket_timeout"] == kwargs["socket_timeout"]

    class OtherStore:
        kind = "cluster"

        def take(self, bucket_keys, args, *, version_key):
            raise NotImplementedError

    assert isinstance(async_store_for(OtherStore()), ThreadedAsyncStore)


def test_a_lease_on_another_plan_does_not_send_this_decision_to_a_thread(rules, monkeypatch):
    other = Plan.objects.create(slug="pro", name="Pro")
    Rule.objects.create(name="pro-global", plan=other, scope=Scope.GLOBAL, rate=1000,
                        period_s=1, burst=1000, lease=10)
    leased = []
    real = limiter()._take_with_leases
    monkeypatch.setattr(limiter(), "_take_with_leases",
                        lambda *args: leased.append(args) or real(*args))
    decision = adecide()
    assert any(rule.lease for rule in limiter().snapshot().rules)  # pro's buckets lease
    assert decision.allowed and not leased  # this request's buckets lease nothing


def test_decisions_are_counted_in_batches_while_the_async_store_waits_for_redis(rules):
    """As on the sync path (test_held_connections): once WAIT_BATCH decisions are queued, the
    next decision's command is written and they are counted while Redis runs it, instead of
    one request counting COUNT_BATCH of them on the event loop."""
    recorder = limiter().recorder

    def request(i):
        made = RequestFactory().get("/", REMOTE_ADDR=f"192.0.2.{100 + i}")
        made.resolver_match = SimpleNamespace(view_name="hello", func=None)
        return made

    async def decide_in_one_loop():
        try:
            for i in range(WAIT_BATCH):
                assert (await guard.adecide(request(i), AnonymousUser())).allowed
            queued_before = recorder.queued()  # not counted yet: nothing has waited since
            await guard.adecide(request(WAIT_BATCH), AnonymousUser())
            return queued_before, recorder.queued()
        finally:
            await limiter().async_store().aclose()

    assert async_to_sync(decide_in_one_loop)() == (WAIT_BATCH, 1)
    assert recorder.counts()[("endpoint", "hello", "allowed")] == WAIT_BATCH + 1
