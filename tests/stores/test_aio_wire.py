"""``AsyncWireStore`` and its ``AsyncWire`` (stores/aio_wire.py) against the suite's real
redis-server: the replies the sync store gives, many coroutines answered in order on one
connection, a cancelled request that does not shift the others' replies, NOSCRIPT, a timeout,
Redis killed and restarted, and the connections it hands to redis.asyncio instead."""

import asyncio

import pytest
import redis

from ratelimit_app.config.snapshot import CompiledRule
from ratelimit_app.decision.buckets import Bucket
from ratelimit_app.decision.engine import take_args
from ratelimit_app.decision.keys import bucket_key
from ratelimit_app.stores import RedisStore, StoreUnavailable
from ratelimit_app.stores.aio import CLIENT_NAME, AsyncRedisStore, AsyncWireStore, async_store_for
from ratelimit_app.stores.base import script_sha

VERSION_KEY = "test:config:version"
RULE = CompiledRule(id=1, name="wire", scope="ip", plan=None, endpoint="", rate=1,
                    period_s=3600, burst=1000, shadow=False, fail_open=None)


def call(identity, cost=1):
    """Return take.lua's ``(keys, args)`` debiting ``cost`` tokens of ``identity``'s bucket."""
    bucket = Bucket(RULE, bucket_key("test", identity), cost)
    return [bucket.key], take_args([bucket])


def level_after(cost):
    """The bucket's level (in the script's units) after a first debit of ``cost`` from a full
    bucket."""
    bucket = Bucket(RULE, "any", cost)
    return bucket.capacity_units - bucket.cost_units


def run(coroutine_function, store):
    """Run ``coroutine_function(store)`` in a new event loop, closing the store's connection
    of that loop afterwards. Returns what it returned."""
    async def main():
        try:
            return await coroutine_function(store)
        finally:
            await store.aclose()

    return asyncio.run(main())


async def take(store, identity, cost=1):
    keys, args = call(identity, cost)
    return await store.take(keys, args, version_key=VERSION_KEY)


@pytest.fixture
def store(redis_server):
    return AsyncWireStore.like(redis.Redis(host="127.0.0.1", port=redis_server.port,
                                           socket_timeout=0.25))


def test_replies_match_the_sync_store(store, redis_server):
    sync = RedisStore(redis_server.client())
    keys, args = call("sync", 7)
    expected = sync.take(keys, args, version_key=VERSION_KEY)
    got = run(lambda s: take(s, "async", 7), store)
    assert got.allowed and expected.allowed
    assert list(got.levels) == list(expected.levels) == [level_after(7)]
    assert got.version == expected.version == "0"


def test_many_coroutines_share_one_connection_and_get_their_own_replies(store, redis_server):
    async def many(s):
        # each coroutine its own bucket and cost: a reply handed to the wrong caller shows
        replies = await asyncio.gather(*[take(s, f"c{i}", cost=1 + i % 50) for i in range(200)])
        with redis_server.client() as client:
            connections = [c for c in client.client_list() if c["name"] == CLIENT_NAME]
        return replies, len(connections)

    replies, connections = run(many, store)
    assert connections == 1
    assert [list(r.levels) for r in replies] == [[level_after(1 + i % 50)] for i in range(200)]


def test_on_an_open_connection_a_request_is_the_reply_future_itself(store):
    """The caller awaits the reply's future with no coroutine between them (one less per
    decision); a request that has to connect first is a coroutine, and both get their reply."""
    async def first_then_second(s):
        wire = s._wire()
        keys, args = call("first")
        command, _ = s.encoded_takes.command(s._sha, tuple(keys), tuple(args), VERSION_KEY)
        connecting = wire.request(command)
        first = await connecting
        keys, args = call("second", 3)
        command, _ = s.encoded_takes.command(s._sha, tuple(keys), tuple(args), VERSION_KEY)
        open_request = wire.request(command)
        second = await open_request
        return connecting, first, open_request, second

    connecting, first, open_request, second = run(first_then_second, store)
    assert asyncio.iscoroutine(connecting)
    assert asyncio.isfuture(open_request)
    assert first[0] == 2 and first[2:] == [level_after(1)]
    assert second[0] == 2 and second[2:] == [level_after(3)]


def test_a_cancelled_request_does_not_shift_the_replies_after_it(store):
    async def with_a_cancelled_one(s):
        first = asyncio.ensure_future(take(s, "a", 2))
        second = asyncio.ensure_future(take(s, "b", 3))
        third = asyncio.ensure_future(take(s, "c", 4))
        await asyncio.sleep(0)  # all three sent (one loop turn, not a delay)
        second.cancel()
        results = await asyncio.gather(first, second, third, return_exceptions=True)
        return results, await take(s, "d", 5)

    (first, second, third), fourth = run(with_a_cancelled_one, store)
    assert isinstance(second, asyncio.CancelledError)
    assert list(first.levels) == [level_after(2)] and list(third.levels) == [level_after(4)]
    assert list(fourth.levels) == [level_after(5)]


@pytest.mark.parametrize("kind", ["wire", "redis.asyncio"])
def test_noscript_after_a_script_flush_loads_the_scripts_once(kind, store, redis_server,
                                                              redis_client):
    # redis.asyncio: the store of connections the wire does not speak (TLS, a credential
    # provider), here on a plain connection
    if kind == "redis.asyncio":
        store = AsyncRedisStore.like(redis.Redis(host="127.0.0.1", port=redis_server.port))

    async def flush_between(s):
        await take(s, "a")
        redis_client.script_flush()
        return await take(s, "b")

    before = redis_server.command_calls("script|load")
    reply = run(flush_between, store)
    assert reply.allowed and list(reply.levels) == [level_after(1)]
    # take.lua, and settle.lua for the settles the sync store sends without waiting
    assert redis_server.command_calls("script|load") - before == 2
    assert redis_client.script_exists(script_sha("take"), script_sha("settle")) == [True, True]


def test_a_reply_later_than_the_socket_timeout_is_unavailable_then_it_reconnects(
        store, redis_client):
    async def paused(s):
        await take(s, "a")
        redis_client.client_pause(2000, all=False)  # writes (our script) wait
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(StoreUnavailable, match="TimeoutError"):
                await take(s, "b")
            waited_s = asyncio.get_running_loop().time() - started
        finally:
            redis_client.client_unpause()
        return waited_s, await take(s, "c")

    waited_s, after = run(paused, store)
    assert 0.2 <= waited_s < 1.5  # the socket timeout (0.25 s), not the 2 s pause
    assert after.allowed and list(after.levels) == [level_after(1)]


def test_redis_killed_then_restarted(store, redis_server):
    async def across_a_restart(s):
        await take(s, "a")
        redis_server.kill()
        with pytest.raises(StoreUnavailable, match="ConnectionError"):
            await take(s, "b")
        with pytest.raises(StoreUnavailable):  # connection refused
            await take(s, "b")
        redis_server.start()  # a new, empty server: no script loaded
        return await take(s, "c")

    reply = run(across_a_restart, store)
    assert reply.allowed and list(reply.levels) == [level_after(1)]


def test_the_database_number_and_client_name_are_set_on_each_connection(redis_server):
    store = AsyncWireStore.like(redis_server.client(db=3))

    async def where(s):
        await take(s, "db")
        with redis_server.client() as client:
            return {c["name"]: c["db"] for c in client.client_list()}.get(CLIENT_NAME)

    assert run(where, store) == "3"
    with redis_server.client(db=3) as client:
        assert client.exists(bucket_key("test", "db"))


def test_connections_the_wire_does_not_speak_go_to_redis_asyncio(redis_server):
    tls = RedisStore(redis.Redis(host="127.0.0.1", port=redis_server.port, ssl=True))
    assert AsyncWireStore.like(tls.client) is None
    assert isinstance(async_store_for(tls), AsyncRedisStore)
    plain = RedisStore(redis_server.client())
    assert isinstance(async_store_for(plain), AsyncWireStore)


def test_requests_of_one_loop_turn_reach_redis_in_one_write(store, redis_server):
    def reads():  # read events Redis processed, on every connection
        with redis_server.client() as client:
            return client.info("stats")["total_reads_processed"]

    async def burst(s):
        await take(s, "warm")  # connected, script loaded
        before = reads()
        replies = await asyncio.gather(*[take(s, f"w{i}") for i in range(100)])
        return replies, reads() - before

    replies, read_events = run(burst, store)
    assert all(r.allowed for r in replies)
    # 100 commands written together: a few reads of the socket (the INFO client's own
    # connection adds one), not one per command
    assert read_events <= 10
