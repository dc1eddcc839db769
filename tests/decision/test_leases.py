"""Leases of hot shared buckets: never over-grant, bounded under-grant, tokens given back on a
refusal, dropped after LEASE_TTL_S and on a config change (see ratelimit_app/decision/leases.py).

Two Limiters on the suite's real Redis stand for two worker processes; a test clock freezes
Redis time, so no token refills behind a test's back.
"""

import pytest
from django.core.exceptions import ValidationError
from django.test import RequestFactory

from ratelimit_app.conf import get_config
from ratelimit_app.models import Plan, Rule, Scope
from ratelimit_app.runtime.limiter import Limiter
from ratelimit_app.stores import RedisStore

from ..helpers import FakeClock

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000_000
GLOBAL_BURST, LEASE = 20, 5


@pytest.fixture
def rules():
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="global", scope=Scope.GLOBAL, rate=1, period_s=3600,
                        burst=GLOBAL_BURST, lease=LEASE)
    Rule.objects.create(name="per-ip", plan=plan, scope=Scope.IP, rate=1, period_s=3600,
                        burst=3)
    return plan


def worker(clock):
    """A Limiter as one worker process has it, on the suite's Redis."""
    return Limiter(get_config(), RedisStore.from_cache_alias("default"), clock,
                   metrics_autostart=False)


def request_from(n):
    return RequestFactory().get("/api/items/", REMOTE_ADDR=f"198.51.100.{n}")


def global_level(redis_client, limiter):
    """Whole tokens left in the global bucket in Redis."""
    rule = next(r for r in limiter.snapshot().rules if r.name == "global")
    from ratelimit_app.decision.buckets import read_state

    level, _stamp, period_ms = read_state(redis_client.get("rl:{global}"), rule.id)
    return level // period_ms


def test_two_workers_never_get_more_than_the_bucket_and_lose_at_most_their_leases(rules):
    clock = FakeClock(T0)
    workers = [worker(clock), worker(clock)]
    allowed = 0
    for n in range(60):  # 60 clients, one request each: only the global bucket can refuse
        allowed += workers[n % 2].decide(request_from(n), None, "api:items").allowed
    assert allowed <= GLOBAL_BURST  # never more than the bucket holds
    # under-grant: only what the two workers still hold in leases is missing
    held = sum(w.leases.held_tokens() for w in workers)
    assert allowed + held == GLOBAL_BURST
    assert held <= 2 * LEASE


def test_a_lease_serves_requests_without_the_hot_bucket(rules, redis_client):
    clock = FakeClock(T0)
    limiter = worker(clock)
    for n in range(6):
        assert limiter.decide(request_from(n), None, "api:items").allowed
    # one call took 1 + 5 tokens; the next five requests spent the lease locally
    assert global_level(redis_client, limiter) == GLOBAL_BURST - 6
    assert limiter.leases.local_spends == 5 and limiter.leases.held_tokens() == 0
    assert limiter.decide(request_from(7), None, "api:items").allowed
    assert global_level(redis_client, limiter) == GLOBAL_BURST - 12  # a new lease


def test_a_refused_request_gives_its_leased_token_back(rules):
    clock = FakeClock(T0)
    limiter = worker(clock)
    for _ in range(3):  # per-ip holds 3
        assert limiter.decide(request_from(1), None, "api:items").allowed
    held = limiter.leases.held_tokens()
    decision = limiter.decide(request_from(1), None, "api:items")
    assert not decision.allowed and decision.violated == ("per-ip",)
    assert limiter.leases.held_tokens() == held  # the global token it spent came back


def test_leases_expire_and_die_with_a_config_change(rules, redis_client, settings):
    clock = FakeClock(T0)
    limiter = worker(clock)
    limiter.decide(request_from(1), None, "api:items")
    assert limiter.leases.held_tokens() == LEASE
    clock.advance(int(get_config()["LEASE_TTL_S"] * 1000) + 1)
    assert limiter.leases.held_tokens() == 0
    before = global_level(redis_client, limiter)
    limiter.decide(request_from(2), None, "api:items")
    assert global_level(redis_client, limiter) == before - 1 - LEASE  # asked Redis again
    limiter.bump_config_version()  # an edit: the rule's numbers may have changed
    limiter.decide(request_from(3), None, "api:items")
    assert global_level(redis_client, limiter) == before - 2 * (1 + LEASE)


def test_a_bucket_that_cannot_spare_a_lease_still_serves_the_request(rules, redis_client):
    clock = FakeClock(T0)
    for n in range(3):  # three workers take a lease each: 3 x (1 + 5) of 20 tokens
        worker(clock).decide(request_from(n), None, "api:items")
    fresh = worker(clock)
    assert global_level(redis_client, fresh) == 2
    assert fresh.decide(request_from(9), None, "api:items").allowed  # 1 token, no lease
    assert global_level(redis_client, fresh) == 1
    assert fresh.leases.held_tokens() == 0


def test_lease_is_only_for_shared_buckets_and_at_most_half_the_burst(db):
    rule = Rule(name="x", scope=Scope.USER, rate=1, period_s=60, burst=100, lease=10)
    with pytest.raises(ValidationError) as error:
        rule.full_clean()
    assert "lease" in error.value.message_dict
    rule.scope = Scope.GLOBAL
    rule.full_clean()
    rule.lease = 51
    with pytest.raises(ValidationError) as error:
        rule.full_clean()
    assert "at most 50" in error.value.message_dict["lease"][0]


# --- on a real Redis Cluster: the hot global bucket's master, and concurrency ------------------

CLUSTER_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 1}


@pytest.fixture
def cluster_workers(redis_cluster, settings, rules):
    """Four Limiters (four workers) on the session's cluster, each with its own client."""
    from ratelimit_app.stores.cluster import ClusterStore

    redis_cluster.ensure_healthy()
    redis_cluster.flushall()
    nodes = [redis_cluster.nodes[0].address]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CLUSTER_NODES": nodes,
                              "CLUSTER_OPTIONS": CLUSTER_OPTIONS}
    clock = FakeClock(T0)
    return [Limiter(get_config(), ClusterStore.from_nodes(nodes, CLUSTER_OPTIONS), clock,
                    metrics_autostart=False) for _ in range(4)]


@pytest.mark.slow
def test_on_a_cluster_leases_spare_the_hot_master_and_never_over_grant(redis_cluster,
                                                                       cluster_workers):
    import threading

    hot_master = redis_cluster.master_of("{global}")
    calls_before = hot_master.command_calls("evalsha")
    allowed = [0] * len(cluster_workers)

    def work(n, limiter):
        for i in range(40):  # distinct clients: only the global bucket (20) can refuse
            allowed[n] += limiter.decide(request_from(n * 40 + i), None, "api:items").allowed

    for worker_limiter in cluster_workers:
        worker_limiter.snapshot()  # loaded here: the test database is not shared with threads
    threads = [threading.Thread(target=work, args=(n, w)) for n, w in enumerate(cluster_workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    held = sum(w.leases.held_tokens() for w in cluster_workers)
    assert sum(allowed) <= GLOBAL_BURST  # never over-granted
    assert sum(allowed) + held == GLOBAL_BURST  # what is missing sits in leases
    # 160 decisions: the global bucket's master serves the lease calls and the IP buckets that
    # hash to it (about a third; refusals come from the deny cache once the bucket is empty),
    # far from one call per decision
    assert hot_master.command_calls("evalsha") - calls_before <= 160 * 0.3
