"""settle.lua through the stores: what a request really cost, added to (or given back to) the
buckets it was debited on after its response, against the suite's real redis-server and the
session's real 3-master Redis Cluster."""

import threading

import pytest
import redis

from ratelimit_app.decision.buckets import read_state
from ratelimit_app.decision.engine import settle_args, take_args
from ratelimit_app.stores.cluster import ClusterStore, key_slot
from ratelimit_app.stores.redis import encode_evalsha

from ..helpers import limiter, make_bucket, make_rule, take

T0 = 1_700_000_000_000


def settle(buckets, extra, now_ms=T0, store=None):
    """Settle ``extra`` tokens on ``buckets``; return the levels in tokens (as ints when whole)."""
    keys, args = settle_args(buckets, extra, now_ms=now_ms)
    reply = (store or limiter().store).settle(keys, args)
    assert all(charged == 0 for _, charged in reply)  # only a credit balance is charged
    return [level / bucket.period_ms for bucket, (level, _) in zip(buckets, reply)]


def level_of(redis_client, bucket):
    return read_state(redis_client.get(bucket.key), bucket.rule.id)[0] / bucket.period_ms


def test_a_further_debit_takes_the_bucket_into_debt_down_to_its_bound(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=10, burst=10, debt=5), cost=2)
    assert take([bucket], now_ms=T0)[0]                 # admitted for 2 of 10
    assert settle([bucket], 10) == [-2]                 # it cost 12: 8 - 10 = -2, in debt
    assert settle([bucket], 10) == [-5]                 # no further than the bound
    assert level_of(redis_client, bucket) == -5


def test_a_bucket_in_debt_refuses_until_the_refill_has_repaid_it(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=1, burst=10, debt=10))
    assert take([bucket], now_ms=T0)[0]
    assert settle([bucket], 14) == [-5]
    allowed, statuses, _ = take([bucket], now_ms=T0 + 1_000)   # -4: nothing left, 5 s to wait
    assert not allowed and statuses[0].remaining == 0 and statuses[0].reset_s == 5
    allowed, statuses, _ = take([bucket], now_ms=T0 + 5_000)   # refilled to 0: still short
    assert not allowed and statuses[0].remaining == 0 and statuses[0].reset_s == 1
    assert take([bucket], now_ms=T0 + 6_000)[0]                # one token again


def test_a_debt_outlives_the_ttl_the_key_had(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=1, burst=2, debt=100))
    assert take([bucket], now_ms=T0)[0]
    ttl_before = redis_client.pttl(bucket.key)
    settle([bucket], 100)                        # -99: 101 s until full again
    assert redis_client.pttl(bucket.key) > ttl_before
    assert redis_client.pttl(bucket.key) > 100_000 - 60_000  # (the test clock is in the past)


def test_a_refund_gives_back_never_above_capacity(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=10), cost=5)
    assert take([bucket], now_ms=T0)[0]
    assert settle([bucket], -3) == [8]           # it cost 2 of the 5 debited
    assert settle([bucket], -30) == [10]         # capped at the burst


def test_the_refill_up_to_the_settle_counts(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=1, burst=10, debt=10), cost=10)
    assert take([bucket], now_ms=T0)[0]
    assert settle([bucket], 5, now_ms=T0 + 3_000) == [-2]    # 0 + 3 refilled - 5


def test_no_debt_bound_means_a_further_debit_stops_at_empty(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=10))
    assert take([bucket], now_ms=T0)[0]
    assert settle([bucket], 50) == [0]


def test_a_refund_to_a_bucket_whose_key_is_gone_writes_nothing(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=10))
    assert settle([bucket], -4) == [10]
    assert redis_client.exists(bucket.key) == 0


def test_buckets_sharing_a_key_and_shadow_buckets_are_settled_gates_are_not(redis_client):
    own = make_bucket(make_rule(rate=1, period_s=60, burst=10, debt=2))
    shadow = make_bucket(make_rule(rate=1, period_s=60, burst=10, shadow=True))
    assert take([own, shadow], now_ms=T0)[0]
    assert settle([own, shadow], 3) == [6, 6]
    assert (level_of(redis_client, own), level_of(redis_client, shadow)) == (6, 6)


def test_a_calendar_quota_counts_the_settled_units(redis_client):
    quota = make_bucket(make_rule(rate=100, calendar="day", debt=20), cost=10)
    assert take([quota], now_ms=T0)[0]
    assert settle([quota], 15) == [75]           # 25 used of 100
    assert settle([quota], 200) == [0]           # used capped at N + debt
    allowed, statuses, _ = take([quota], now_ms=T0)
    assert not allowed and statuses[0].remaining == 0
    assert settle([quota], -500) == [100]        # a refund never below 0 used


def test_concurrent_settles_never_pass_the_bound(redis_client):
    """Eight threads each settle 40 further tokens, 1 at a time, on one bucket: each call is
    atomic, so the bucket ends exactly at its bound, never below."""
    bucket = make_bucket(make_rule(rate=1, period_s=3600, burst=100, debt=50))
    assert take([bucket], now_ms=T0)[0]

    def settle_many():
        for _ in range(40):
            settle([bucket], 1)

    threads = [threading.Thread(target=settle_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert level_of(redis_client, bucket) == -50


@pytest.fixture
def cluster_store(redis_cluster):
    redis_cluster.ensure_healthy()
    redis_cluster.flushall()
    store = ClusterStore(redis_cluster.client())
    yield store
    store.close()


def test_a_settle_on_a_cluster_reaches_every_slot_group(cluster_store, redis_cluster):
    rules = [make_rule(rate=1, period_s=60, burst=10, debt=4) for _ in range(3)]
    buckets = [make_bucket(rule, cost=2, token=f"user.settle{i}") for i, rule in enumerate(rules)]
    assert len({key_slot(b.key.encode()) for b in buckets}) > 1  # several slot groups
    reply = cluster_store.take([b.key for b in buckets], take_args(buckets, T0),
                               version_key="rl:config:version")
    assert reply.allowed
    assert settle(buckets, 9, store=cluster_store) == [-1, -1, -1]    # 8 - 9
    assert settle(buckets, 9, store=cluster_store) == [-4, -4, -4]    # bounded at -4
    assert settle(buckets, -20, store=cluster_store) == [10, 10, 10]
    client = redis_cluster.client()
    assert [level_of(client, b) for b in buckets] == [10, 10, 10]


def test_the_settle_command_is_encoded_as_redis_py_would_send_it():
    keys = ["rl:{user:7}:u", "rl:{user:7}:credits"]
    args = [b"", b"\x00\x01\r\n$*", 1_700_000_000_000, b"x" * 70_000]
    packed = redis.Connection().pack_command("EVALSHA", "a" * 40, len(keys), *keys, *args)
    assert encode_evalsha("a" * 40, keys, args) == b"".join(packed)
