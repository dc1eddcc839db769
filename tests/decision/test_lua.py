"""take.lua through engine.take: token math, all-or-nothing, shadow, TTLs, clock guard, units."""

from ratelimit_app.decision.buckets import read_state, unpack_value

from ..helpers import limiter, make_bucket, make_rule, take

T0 = 1_700_000_000_000  # an arbitrary "now" in ms; the script accepts it in tests


def stored_state(redis_client, bucket):
    """Return (level, timestamp_ms, period_ms) as the script stored them."""
    return read_state(redis_client.get(bucket.key), bucket.rule.id)


def remaining(statuses):
    return [s.remaining for s in statuses]


def test_new_bucket_starts_full_and_burst_caps_spending():
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=3))
    results = [take([bucket], now_ms=T0)[0] for _ in range(4)]
    assert results == [True, True, True, False]


def test_refill_adds_rate_per_period_exactly():
    bucket = make_bucket(make_rule(rate=10, period_s=1, burst=10))
    for _ in range(10):
        assert take([bucket], now_ms=T0)[0]
    assert not take([bucket], now_ms=T0)[0]
    assert not take([bucket], now_ms=T0 + 99)[0]       # 0.99 token refilled
    allowed, statuses, _ = take([bucket], now_ms=T0 + 100)  # exactly one token
    assert allowed and statuses[0].remaining == 0
    allowed, statuses, _ = take([bucket], now_ms=T0 + 10_000)  # long idle: capped at burst
    assert allowed and statuses[0].remaining == 9


def test_refill_never_drifts_when_touched_every_millisecond():
    # 1 token per 7 s touched every ms: a rounding limiter would lose the fractions forever.
    bucket = make_bucket(make_rule(rate=1, period_s=7, burst=1))
    assert take([bucket], now_ms=T0)[0]
    for ms in range(1, 7000, 1):
        if ms % 500 == 0:
            assert not take([bucket], now_ms=T0 + ms)[0]
    assert take([bucket], now_ms=T0 + 7000)[0]


def test_cost_greater_than_one():
    bucket = make_bucket(make_rule(rate=1, period_s=1, burst=10), cost=4)
    assert [take([bucket], now_ms=T0)[0] for _ in range(3)] == [True, True, False]
    _, statuses, _ = take([bucket], now_ms=T0)
    assert statuses[0].remaining == 2 and statuses[0].short
    assert statuses[0].reset_s == 2  # 2 more tokens at 1 per second


def test_all_or_nothing_across_five_levels(redis_client):
    rules = [make_rule(rate=1, period_s=60, burst=b, scope=s) for b, s in
             [(100, "global"), (100, "plan"), (100, "tenant"), (100, "user"), (2, "user")]]
    buckets = [make_bucket(r, token=f"t{i}") for i, r in enumerate(rules)]
    assert take(buckets, now_ms=T0)[0]
    assert take(buckets, now_ms=T0)[0]
    before = [redis_client.get(b.key) for b in buckets]
    allowed, statuses, _ = take(buckets, now_ms=T0)
    assert not allowed
    assert [redis_client.get(b.key) for b in buckets] == before  # nothing debited
    assert remaining(statuses) == [98, 98, 98, 98, 0]
    assert [s.short for s in statuses] == [False] * 4 + [True]


def test_shadow_bucket_never_denies_but_reports_would_be_denial():
    enforced = make_bucket(make_rule(rate=1, period_s=60, burst=100), token="a")
    shadow = make_bucket(make_rule(rate=1, period_s=60, burst=1, shadow=True), token="b")
    first = take([enforced, shadow], now_ms=T0)
    second = take([enforced, shadow], now_ms=T0)
    assert first[0] and second[0]
    assert remaining(first[1]) == [99, 0]
    assert second[1][1].short and not second[1][0].short
    assert remaining(second[1]) == [98, 0]


def test_shadow_bucket_is_debited_like_an_enforced_one():
    shadow = make_bucket(make_rule(rate=1, period_s=60, burst=5, shadow=True))
    for expected in [4, 3, 2]:
        assert take([shadow], now_ms=T0)[1][0].remaining == expected


def test_every_key_gets_a_ttl_of_the_time_to_refill(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=10, burst=5), cost=2)
    take([bucket], now_ms=T0)
    ttl_ms = redis_client.pttl(bucket.key)
    assert 19_000 <= ttl_ms <= 21_000  # 2 tokens at 1 per 10 s, and at most 1 s to spare


def test_one_identity_shares_one_key_whose_ttl_covers_its_slowest_bucket(redis_client):
    slow = make_bucket(make_rule(rate=1, period_s=100, burst=5))   # full again in 100 s
    fast = make_bucket(make_rule(rate=10, period_s=1, burst=10))   # full again in 0.1 s
    assert slow.key == fast.key
    take([slow, fast], now_ms=T0)
    expiry, records = unpack_value(redis_client.get(slow.key))
    assert set(records) == {slow.rule.id, fast.rule.id}
    assert T0 + 100_000 <= expiry <= T0 + 101_000
    assert 99_000 <= redis_client.pttl(slow.key) <= 101_000
    # a debit of the fast bucket alone keeps the other record and needs no longer life:
    # the key is rewritten with its TTL untouched
    redis_client.pexpire(slow.key, 200_000)
    take([fast], now_ms=T0 + 50)
    assert set(unpack_value(redis_client.get(slow.key))[1]) == {slow.rule.id, fast.rule.id}
    assert redis_client.pttl(slow.key) > 150_000
    # a debit that needs a longer life than the key's expiry re-arms it
    redis_client.pexpire(slow.key, 200_000)
    take([slow], now_ms=T0 + 100)
    assert 199_000 <= redis_client.pttl(slow.key) <= 201_000


def test_denied_call_writes_nothing(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=1), token="x")
    take([bucket], now_ms=T0)
    stored = redis_client.get(bucket.key)
    assert not take([bucket], now_ms=T0 + 1)[0]
    assert redis_client.get(bucket.key) == stored


def test_timestamp_never_moves_backwards(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=1, burst=1))
    assert take([bucket], now_ms=T0 + 1000)[0]
    # A call carrying an older clock must neither refill nor rewind the stamp.
    assert not take([bucket], now_ms=T0)[0]
    assert not take([bucket], now_ms=T0 + 1500)[0]
    assert take([bucket], now_ms=T0 + 2000)[0]
    level, stamp, period = stored_state(redis_client, bucket)
    assert stamp == T0 + 2000


def test_state_is_stored_as_integers(redis_client):
    bucket = make_bucket(make_rule(rate=3, period_s=7, burst=5))
    take([bucket], now_ms=T0)
    take([bucket], now_ms=T0 + 1234)
    value = redis_client.get(bucket.key)
    assert len(value) == 8 + 28  # the key's expiry, then the bucket's rule id and 3 integers
    level, stamp, period = stored_state(redis_client, bucket)
    assert period == 7000 and stamp == T0 + 1234
    # 5 tokens - 1, + 1234 ms * 3 units/ms, - 1 token (7000 units each)
    assert level == 5 * 7000 - 7000 + 1234 * 3 - 7000


def test_period_change_rescales_the_stored_level():
    old = make_rule(rate=1, period_s=10, burst=10)
    take([make_bucket(old)], now_ms=T0)  # 9 of 10 tokens left, in 10 s units
    changed = old.with_numbers(rate=1, period_s=20, burst=10)
    _, statuses, _ = take([make_bucket(changed)], now_ms=T0, debit=False)
    assert statuses[0].remaining == 9


def test_peek_debits_nothing(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=2))
    for _ in range(3):
        allowed, statuses, _ = take([bucket], now_ms=T0, debit=False)
        assert allowed and statuses[0].remaining == 2
    assert redis_client.get(bucket.key) is None


def test_server_clock_is_used_without_now():
    bucket = make_bucket(make_rule(rate=1, period_s=3600, burst=1))
    assert take([bucket])[0]
    assert not take([bucket])[0]


def test_reply_carries_the_config_version(redis_client):
    redis_client.set("rl:config:version", "41")
    assert take([make_bucket(make_rule())], now_ms=T0)[2] == "41"


def test_a_value_that_is_not_a_bucket_reads_as_full(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=3))
    redis_client.set(bucket.key, "5:garbage")
    allowed, statuses, _ = take([bucket], now_ms=T0)
    assert allowed and statuses[0].remaining == 2
    assert stored_state(redis_client, bucket) == (2 * 60_000, T0, 60_000)


def test_a_gate_bucket_is_checked_but_never_debited(redis_client):
    from ratelimit_app.decision.buckets import Bucket

    quota = make_bucket(make_rule(rate=1, period_s=60, burst=100), token="t1")
    rule = make_rule(rate=1, period_s=60, burst=2, scope="ip")
    gate = Bucket(rule, make_bucket(rule, token="t2").key, 1, gate=True)
    charge = Bucket(rule, gate.key, 1)  # what a failed authentication spends
    for _ in range(5):  # requests pass and never spend the gate
        allowed, statuses, _ = take([quota, gate], now_ms=T0)
        assert allowed and statuses[1].remaining == 2
    assert take([charge], now_ms=T0)[0] and take([charge], now_ms=T0)[0]
    allowed, statuses, _ = take([quota, gate], now_ms=T0)
    assert not allowed and statuses[1].short
    assert statuses[0].remaining == 95  # all or nothing: the quota was not debited either
    assert take([quota, gate], now_ms=T0 + 60_000)[0]  # one failure refilled: open again


def test_reply_statuses_of_every_outcome():
    # the short reply (every bucket debited) and the full one parse to the same TakeReply shape
    from ratelimit_app.decision.buckets import Bucket

    def raw(buckets, debit=True):
        reply = limiter().take(buckets, now_ms=T0, debit=debit)
        return reply.allowed, list(reply.levels), list(reply.results)

    a = make_bucket(make_rule(rate=1, period_s=1, burst=3), token="r1")
    b = make_bucket(make_rule(rate=1, period_s=1, burst=1), token="r2")
    shadow = make_bucket(make_rule(rate=1, period_s=1, burst=1, shadow=True), token="r3")
    gate_rule = make_rule(rate=1, period_s=1, burst=1, scope="ip")
    gate = Bucket(gate_rule, make_bucket(gate_rule, token="r4").key, 1, gate=True)
    assert raw([a, b]) == (True, [2000, 0], [1, 1])
    assert raw([a, b], debit=False) == (False, [2000, 0], [0, -1])
    assert raw([a], debit=False) == (True, [2000], [0])
    assert raw([a, gate]) == (True, [1000, 1000], [1, 0])
    assert raw([a, shadow]) == (True, [0, 0], [1, 1])
    assert raw([a, shadow]) == (False, [0, 0], [-1, -1])  # a is empty now
    assert raw([b, shadow]) == (False, [0, 0], [-1, -1])
    assert raw([]) == (True, [], [])


def test_a_key_holding_another_rules_bucket_keeps_it(redis_client):
    from ratelimit_app.decision.buckets import pack_value

    first = make_bucket(make_rule(rate=1, period_s=60, burst=5))
    second = make_bucket(make_rule(rate=1, period_s=1, burst=5))
    assert first.key == second.key
    redis_client.set(first.key, pack_value({first.rule.id: (2 * 60_000, T0, 60_000)},
                                           T0 + 200_000), px=200_000)
    assert take([second], now_ms=T0)[0]
    expiry, records = unpack_value(redis_client.get(first.key))
    assert records == {first.rule.id: (2 * 60_000, T0, 60_000), second.rule.id: (4000, T0, 1000)}
    assert expiry == T0 + 200_000 and redis_client.pttl(first.key) > 150_000  # KEEPTTL
    # two buckets of one key in one call, neither stored yet: both records are written
    third = make_bucket(make_rule(rate=1, period_s=1, burst=2), token="fresh")
    fourth = make_bucket(make_rule(rate=2, period_s=1, burst=2), token="fresh")
    assert take([third, fourth], now_ms=T0)[0]
    assert unpack_value(redis_client.get(third.key))[1] == {
        third.rule.id: (1000, T0, 1000), fourth.rule.id: (1000, T0, 1000)}


def test_a_long_idle_refill_past_2_pow_53_is_exact(redis_client):
    # gap * refill exceeds 2^53 units: the level is capped at capacity, exactly
    bucket = make_bucket(make_rule(rate=10**9, period_s=1, burst=10**6))
    assert take([bucket], now_ms=T0)[0]
    allowed, statuses, _ = take([bucket], now_ms=T0 + 10**10)
    assert allowed and statuses[0].level_units == 10**6 * 1000 - 1000


def test_a_key_is_rewritten_without_ttl_while_its_expiry_suffices(redis_client):
    bucket = make_bucket(make_rule(rate=10, period_s=1, burst=10))  # 100 ms per token
    take([bucket], now_ms=T0)                  # full again at T0 + 100 ms: expiry T0 + 1.1 s
    expiry = unpack_value(redis_client.get(bucket.key))[0]
    assert expiry == T0 + 1100
    redis_client.pexpire(bucket.key, 500_000)  # shows whether a write re-arms the TTL
    for k in range(1, 7):                      # full again at T0 + 500 + k * 100 ms
        take([bucket], now_ms=T0 + 500)
        assert unpack_value(redis_client.get(bucket.key))[0] == expiry
        assert redis_client.pttl(bucket.key) > 400_000
    take([bucket], now_ms=T0 + 500)            # full at T0 + 1.2 s: re-armed
    assert unpack_value(redis_client.get(bucket.key))[0] == T0 + 1200 + 1000
    assert redis_client.pttl(bucket.key) < 400_000
