"""``Limiter.settle`` and ``asettle``: a request's real cost, known after its response, settled
on the buckets it was debited on (settle.lua, see tests/stores/test_settle.py), against the
suite's real redis-server."""

import asyncio
import logging

from django.conf import settings
from django.test import override_settings

from ratelimit_app.decision.buckets import ConcurrencySlot
from ratelimit_app.decision.engine import settled_buckets
from ratelimit_app.runtime.limiter import Limiter

from ..helpers import limiter, make_bucket, make_rule, poll_until, take

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


def test_a_settle_sent_without_waiting_has_its_reply_read_by_the_flush_even_with_metrics_off():
    # a worker whose first request is metered, or one that counts nothing: no decision has
    # started the flush thread, which reads the replies of settles sent without waiting
    with override_settings(RATELIMIT_APP={**settings.RATELIMIT_APP, "METRICS_ENABLED": False,
                                          "METRICS_FLUSH_INTERVAL_S": 0.05}):
        worker = Limiter.from_settings()  # autostart, as in a server process
    try:
        bucket = make_bucket(make_rule(rate=1, period_s=60, burst=10, debt=5), cost=2)
        assert worker.take([bucket]).allowed  # 8 left (at Redis's time, as the settle's)
        assert not worker.flusher.running
        replies = []
        worker.settle_units_later(settled_buckets([bucket]), 3, replies.append)
        poll_until(lambda: replies, 5, "the settle's reply read")
        [[(level, charged)]] = replies  # read with no further call
        assert (level // bucket.period_ms, charged) == (5, 0)  # 8 - 3 (and a few ms' refill)
    finally:
        worker.close()
