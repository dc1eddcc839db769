"""Settles sent without waiting for their replies (HeldConnections.send_unanswered,
RedisStore.settle_later), against the suite's real redis-server: Redis applies each as it
arrives; the replies are read in the order sent, in one go once MAX_UNANSWERED are owed, before
the connection's next request, after it sat idle, or by collect; settle.lua is loaded before a
store's first settle and after a take's NOSCRIPT, and a refused settle (NOSCRIPT) is sent again
once; a lost reply is reported, never sent twice."""

import signal

import pytest
import redis
from django_redis import get_redis_connection
from redis.connection import Connection
from redis.exceptions import NoScriptError

from ratelimit_app.decision.engine import settle_args
from ratelimit_app.stores.base import StoreUnavailable
from ratelimit_app.stores.connections import MAX_UNANSWERED, HeldConnections
from ratelimit_app.stores.redis import (
    MAX_ENCODED_HEADS,
    EvalshaEncoder,
    RedisStore,
    encode_evalsha,
)
from ratelimit_app.testing import RedisServer

from ..helpers import limiter, make_bucket, make_rule, poll_until, take

T0 = 1_700_000_000_000
CLIENT_ID = Connection().pack_command("CLIENT", "ID")


def incr(key):
    return Connection().pack_command("INCR", key)


@pytest.fixture
def held():
    """HeldConnections on the suite's Redis that never check an idle connection (the tests
    that want the check set recheck_after_s themselves)."""
    connections = HeldConnections(get_redis_connection("default").connection_pool,
                                  recheck_after_s=3600)
    yield connections
    connections.give_back()


def test_replies_are_read_in_order_once_max_unanswered_are_owed(held, redis_client):
    replies = []
    for _ in range(MAX_UNANSWERED):
        held.send_unanswered(incr("n"), replies.append)
    # Redis applied every one as it arrived; none of their replies was read
    poll_until(lambda: redis_client.get("n") == str(MAX_UNANSWERED).encode())
    assert replies == [] and len(held._idle[0][3]) == MAX_UNANSWERED
    held.send_unanswered(incr("n"), replies.append)  # owed MAX_UNANSWERED: read them first
    assert replies == list(range(1, MAX_UNANSWERED + 1))
    assert len(held._idle) == 1 and len(held._idle[0][3]) == 1


def test_a_request_reads_the_replies_owed_before_its_own(held):
    replies = []
    held.send_unanswered(incr("n"), replies.append)
    held.send_unanswered(incr("n"), replies.append)
    assert held.request(incr("n")) == 3  # its own reply, not a settle's
    assert replies == [1, 2] and held._idle[0][3] == ()


def test_a_connection_idle_past_the_recheck_reads_its_replies_before_the_check(held):
    replies = []
    held.send_unanswered(incr("n"), replies.append)
    held.recheck_after_s = 0  # as if it sat idle: the check would take the reply for stray data
    opened = held._idle[0][0]._sock
    held.send_unanswered(incr("n"), replies.append)
    assert replies == [1] and held._idle[0][0]._sock is opened  # read, and not reopened
    held.collect()
    assert replies == [1, 2] and held._idle[0][3] == ()


def test_an_error_reply_is_handed_on_and_keeps_the_connection(held):
    replies = []
    held.send_unanswered(Connection().pack_command("EVALSHA", "0" * 40, 0), replies.append)
    held.send_unanswered(incr("n"), replies.append)
    held.collect()
    # known by its code (NOSCRIPT), whatever the server's words after it
    assert isinstance(replies[0], NoScriptError) and replies[1] == 1
    assert held.request(incr("n")) == 2


@pytest.fixture
def private_server(server_executable):
    """A redis-server of the test's own, to stop and kill."""
    server = RedisServer(executable=server_executable).start()
    yield server
    server.stop()


def lose_the_reply(server):
    """Stop ``server`` (what is sent to it now waits in the kernel, unread), then kill it: the
    connection fails with the reply never written."""
    server.process.send_signal(signal.SIGSTOP)
    return server.kill


def test_a_lost_reply_is_handed_on_as_the_failure(private_server):
    held = HeldConnections(redis.ConnectionPool.from_url(private_server.url),
                           recheck_after_s=3600)
    replies = []
    assert held.request(incr("n")) == 1
    kill = lose_the_reply(private_server)
    held.send_unanswered(incr("n"), replies.append)
    held.send_unanswered(incr("n"), replies.append)
    kill()
    held.collect()
    assert len(replies) == 2 and all(isinstance(r, ConnectionError) for r in replies)


@pytest.fixture
def bucket():
    rule = make_rule(rate=1, period_s=10, burst=10, debt=5)
    placed = make_bucket(rule, cost=2)
    assert take([placed], now_ms=T0)[0]  # admitted for 2 of 10: 8 left
    return placed


def settle_later(bucket, extra, store):
    replies = []
    store.settle_later(*settle_args([bucket], extra, now_ms=T0), replies.append)
    return replies


def test_a_settle_later_reports_its_levels_once_read(bucket):
    store = limiter().store
    replies = settle_later(bucket, 3, store)
    assert replies == []
    store.collect_unanswered()
    assert replies == [[(5 * bucket.period_ms, 0)]]  # 8 - 3


def test_a_settle_refused_with_noscript_is_sent_again_once(bucket, redis_client):
    store = limiter().store
    settle_later(bucket, 1, store)
    store.collect_unanswered()  # the script is loaded
    redis_client.script_flush()
    replies = settle_later(bucket, 3, store)
    store.collect_unanswered()
    assert replies == [[(4 * bucket.period_ms, 0)]]  # 8 - 1 - 3: applied once


def test_a_first_settle_on_a_redis_without_the_script_applies_with_its_reply_unread(
        bucket, redis_client):
    redis_client.script_flush()  # a Redis started since: no script loaded
    store = RedisStore(redis_client)  # a worker's store before its first settle
    try:
        replies = settle_later(bucket, 3, store)
        # Redis ran it as it arrived: no NOSCRIPT waiting for a read that may never come
        poll_until(lambda: level(redis_client, bucket) == 5, 5, "the settle applied")
        assert replies == []
    finally:
        store.close()


def test_a_take_that_meets_noscript_loads_the_settle_script_again(bucket, redis_client):
    store = limiter().store
    settle_later(bucket, 1, store)
    store.collect_unanswered()  # settle.lua is loaded: 7 left
    redis_client.script_flush()  # Redis restarted between two requests
    assert take([bucket], now_ms=T0, debit=False)[0]  # the next request's take: NOSCRIPT
    replies = settle_later(bucket, 3, store)
    poll_until(lambda: level(redis_client, bucket) == 4, 5, "the settle applied")
    assert replies == []


def test_a_settle_whose_reply_was_lost_is_reported_and_not_sent_again(private_server, bucket):
    store = RedisStore(private_server.client())
    assert settle_later(bucket, 0, store) == [] and store.collect_unanswered() is None
    kill = lose_the_reply(private_server)
    replies = settle_later(bucket, 3, store)
    kill()
    store.collect_unanswered()
    assert len(replies) == 1 and isinstance(replies[0], StoreUnavailable)
    private_server.start()
    fresh = private_server.client()
    replies = settle_later(bucket, 1, store)
    store.collect_unanswered()
    assert len(replies) == 1 and not isinstance(replies[0], StoreUnavailable)
    # the settle whose reply was lost was not sent again: since the restart, one settle ran
    # (after a NOSCRIPT: the restarted server had no scripts)
    calls = fresh.info("commandstats")["cmdstat_evalsha"]
    assert calls["calls"] - calls["failed_calls"] == 1


def level(redis_client, bucket):
    from ratelimit_app.decision.buckets import read_state

    return read_state(redis_client.get(bucket.key), bucket.rule.id)[0] / bucket.period_ms


def test_the_encoder_keeps_a_bounded_number_of_heads():
    encoder = EvalshaEncoder()
    for n in range(MAX_ENCODED_HEADS + 1):
        command = encoder.encode("a" * 40, (f"k{n}",), [b"", 7])
        assert command == encode_evalsha("a" * 40, [f"k{n}"], [b"", 7])
    assert len(encoder.heads) == 1  # started afresh when full


def test_collect_leaves_connections_that_owe_nothing_where_they_are(held):
    held.request(incr("n"))
    entry = held._idle[0]
    held.collect()  # (the metrics flush, every second, in a worker without metered traffic)
    assert held._idle == [entry] and held._idle[0] is entry


def test_replies_read_when_connections_are_sorted_out_are_handed_on_once(held):
    # (a Sentinel store does this when the master may have moved: the pool owns this one)
    replies = []
    held.send_unanswered(incr("n"), replies.append)
    held.release_unowned()
    held.collect()
    assert held.request(incr("n")) == 2
    assert replies == [1]
