"""``Limiter.settle`` and ``asettle``: a request's real cost, known after its response, settled
on the buckets it was debited on (settle.lua, see tests/stores/test_settle.py), against the
suite's real redis-server."""

import asyncio
import logging

from ratelimit_app.decision.buckets import ConcurrencySlot

from ..helpers import limiter, make_bucket, make_rule, take

T0 = 1_700_000_000_000


def test_a_further_debit_shows_the_debt_as_nothing_left_and_refuses_after():
    bucket = make_bucket(make_rule(rate=1, period_s=1, burst=10, debt=10), cost=2)
    assert take([bucket], now_ms=T0)[0]
    [status] = limiter().settle([bucket], 12, now_ms=T0)   # 8 - 12: 4 in debt
    assert (status.remaining, status.short, status.level_units) == (0, True, -4_000)
    assert status.reset_s == 6                             # until the 2 tokens it costs
    allowed, statuses, _ = take([bucket], now_ms=T0 + 5_000)   # repaid, 1 of the 2 it costs
    assert not allowed and statuses[0].remaining == 1
    assert take([bucket], now_ms=T0 + 6_000)[0]


def test_a_refund_makes_the_deny_cache_forget_the_levels_it_raised():
    rule = make_rule(rate=1, period_s=3600, burst=2)
    bucket = make_bucket(rule)
    cache = limiter().deny_cache
    assert take([bucket], now_ms=T0)[0] and take([bucket], now_ms=T0)[0]
    allowed, statuses, version = take([bucket], now_ms=T0)
    assert not allowed
    cache.remember([bucket], statuses, version, cache.now())
    assert cache.lookup([bucket], version) is not None      # denied without Redis
    limiter().settle([bucket], -2, now_ms=T0)              # both requests cost nothing
    assert cache.lookup([bucket], version) is None          # Redis is asked again
    assert take([bucket], now_ms=T0)[0]


def test_nothing_to_settle_makes_no_call(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=10))
    assert limiter().settle([bucket], 0) is None
    slot = ConcurrencySlot(make_rule(rate=2, period_s=30), bucket.key, 1)
    assert limiter().settle([slot], 3) is None
    assert redis_client.dbsize() == 0


def test_a_settle_the_store_cannot_take_is_logged_and_raises_nothing(redis_server, caplog):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=10))
    redis_server.kill()
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        assert limiter().settle([bucket], 5) is None
    assert "a request's cost was not settled" in caplog.text


def test_asettle_on_an_event_loop(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=10, debt=1), cost=1)
    assert take([bucket], now_ms=T0)[0]
    [status] = asyncio.run(limiter().asettle([bucket], 3, now_ms=T0))
    assert status.remaining == 6
