"""Async stores: a decision's one call awaited on an asyncio event loop (``Limiter.adecide``,
used by QuotaMiddleware under an ASGI server).

- ``AsyncWireStore`` (beside ``RedisStore``, for TCP and Unix-socket connections without TLS or
  a credential provider): take.lua's EVALSHA, encoded once per bucket plan, on one connection
  per event loop shared by all its coroutines (``AsyncWire``: an asyncio protocol with a
  hiredis reader, replies handed out in order). NOSCRIPT loads the script and sends the call
  again, as RedisStore does; connection, timeout and error replies become StoreUnavailable.
- ``AsyncRedisStore`` (the other single-node connections: TLS, a credential provider): a
  ``redis.asyncio`` client connected as the
  RedisStore's own client is (the django-redis cache's LOCATION and OPTIONS: host, port or
  socket, db, credentials, TLS, timeouts, pool size), sending take.lua's EVALSHA (NOSCRIPT
  loads take.lua and settle.lua, as AsyncWireStore does, and sends the call again) with the
  same reply parsing. While it waits for Redis, the event loop serves other requests.
- ``ThreadedAsyncStore``: every other store (Cluster, Sentinel) runs its own sync ``take`` in a
  worker thread (``sync_to_async(thread_sensitive=False)``), so their slot grouping, refunds,
  master following and READONLY retry stay in one place. The loop is not blocked; the price is a
  thread hop per decision (measured in docs/howto/asgi.md).

Both are awaited through the Limiter's ``atake``: one breaker and one set of error counters
for the sync and the async paths of a process.

redis.asyncio connections belong to the event loop that opened them, so a client is kept per
loop (an ASGI worker has one; a test may run several).
"""

import asyncio
import weakref

import hiredis
import redis.asyncio
from asgiref.sync import sync_to_async
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from .aio_wire import AsyncWire
from .base import StoreUnavailable, script_sha, script_source
from .ban_checks import folded_call
from .redis import EncodedTakes, RedisStore, parse_take_reply

__all__ = ["AsyncWireStore", "AsyncRedisStore", "ThreadedAsyncStore", "async_store_for",
           "CLIENT_NAME"]

#: the async connections' name in CLIENT LIST (operators, and the test, tell them apart)
CLIENT_NAME = "ratelimit_app:async"

# What the RedisStore's connections are made with that an asyncio connection understands too.
# The rest of redis-py's pool kwargs are its sync internals (parser, maintenance handlers).
_CONNECTION_KWARGS = ("host", "port", "path", "db", "username", "password",
                      "credential_provider", "socket_timeout", "socket_connect_timeout",
                      "socket_keepalive", "socket_keepalive_options", "health_check_interval")


# What the async stores load after a NOSCRIPT: take.lua, and settle.lua with it, because the
# sync store sends settles without waiting and one refused is sent again only once its reply is
# read (RedisStore._settle_script).
SCRIPTS_AFTER_NOSCRIPT = ("take", "settle")


def async_store_for(store):
    """Return the async store for ``store``: an AsyncWireStore (or, for connections it does not
    speak, an AsyncRedisStore) for a single node, else a ThreadedAsyncStore around it."""
    if type(store) is RedisStore:
        return AsyncWireStore.like(store.client) or AsyncRedisStore.like(store.client)
    return ThreadedAsyncStore(store)


class AsyncWireStore:
    """take.lua on one Redis node through an ``AsyncWire`` per event loop."""

    kind = "redis"

    def __init__(self, address, *, db=0, username=None, password=None, timeout_s=None,
                 connect_timeout_s=None):
        setup = []
        if password is not None:
            setup.append(("AUTH", username, password) if username else ("AUTH", password))
        if db:
            setup.append(("SELECT", db))
        setup.append(("CLIENT", "SETNAME", CLIENT_NAME))
        self._wire_options = dict(address=address, setup_commands=setup, timeout_s=timeout_s,
                                  connect_timeout_s=connect_timeout_s)
        self._sha = script_sha("take")
        self._scripts_load = [hiredis.pack_command(("SCRIPT", "LOAD", script_source(name)))
                              for name in SCRIPTS_AFTER_NOSCRIPT]
        self.encoded_takes = EncodedTakes(hiredis.pack_command)
        self._wires = weakref.WeakKeyDictionary()  # event loop -> its AsyncWire

    @classmethod
    def like(cls, client):
        """Return a store connecting as the sync redis-py ``client`` does, or None when its
        connections need what AsyncWire does not do (TLS, a credential provider, a
        connection class of its own)."""
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        kind = pool.connection_class.__name__
        if kind not in ("Connection", "UnixDomainSocketConnection") or \
                kwargs.get("credential_provider") is not None:
            return None
        address = kwargs["path"] if kind == "UnixDomainSocketConnection" else \
            (kwargs.get("host", "localhost"), kwargs.get("port", 6379))
        timeout_s = kwargs.get("socket_timeout")
        return cls(address, db=kwargs.get("db") or 0, username=kwargs.get("username"),
                   password=kwargs.get("password"), timeout_s=timeout_s,
                   connect_timeout_s=kwargs.get("socket_connect_timeout") or timeout_s)

    def run_while_waiting(self, work):
        """Run ``work`` (a callable that must not raise) each time a turn of the loop has
        written its commands, while Redis runs them (see Store.run_while_waiting): on
        connections opened from now on."""
        self._wire_options["while_waiting"] = work

    def _wire(self):
        loop = asyncio.get_running_loop()
        wire = self._wires.get(loop)
        if wire is None:
            wire = self._wires[loop] = AsyncWire(**self._wire_options)
        return wire

    async def take(self, bucket_keys, args, *, version_key):
        """``RedisStore.take``, awaited. Returns a TakeReply; raises StoreUnavailable."""
        command, fold = self.encoded_takes.command(self._sha, tuple(bucket_keys), tuple(args),
                                                   version_key)
        wire = self._wire()
        try:
            try:
                reply = await wire.request(command)
            except NoScriptError:  # after a restart or SCRIPT FLUSH: the script did not run
                for script_load in self._scripts_load:
                    await wire.request(script_load)
                reply = await wire.request(command)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        reply = parse_take_reply(reply)
        return reply if fold is None else fold.unfold(reply)

    async def aclose(self):
        """Close the running loop's connection (before that loop ends)."""
        wire = self._wires.pop(asyncio.get_running_loop(), None)
        if wire is not None:
            wire.close()


class AsyncRedisStore:
    """take.lua on one Redis node through ``redis.asyncio``."""

    kind = "redis"

    def __init__(self, connection_class, connection_kwargs, max_connections):
        self._connection_class = connection_class
        self._connection_kwargs = connection_kwargs
        self._max_connections = max_connections
        self._sha = script_sha("take")
        self._sources = [script_source(name) for name in SCRIPTS_AFTER_NOSCRIPT]
        self._clients = weakref.WeakKeyDictionary()  # event loop -> its redis.asyncio client

    @classmethod
    def like(cls, client):
        """Return a store connecting as the sync redis-py ``client`` does (django-redis built
        that client's pool from the cache's LOCATION and OPTIONS)."""
        pool = client.connection_pool
        kwargs = {name: value for name, value in pool.connection_kwargs.items()
                  if name in _CONNECTION_KWARGS or name.startswith("ssl_")}
        connection_class = {
            "UnixDomainSocketConnection": redis.asyncio.UnixDomainSocketConnection,
            "SSLConnection": redis.asyncio.SSLConnection,
        }.get(pool.connection_class.__name__, redis.asyncio.Connection)
        return cls(connection_class, kwargs, pool.max_connections)

    def _client(self):
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # A blocking pool: a burst of concurrent requests waits its turn for one of the same
            # number of connections the sync pool allows, rather than failing. No retries, as
            # in the sync client: a take retried after a timeout may debit twice, and the
            # breaker, not a retry loop, deals with a Redis that is down.
            pool = redis.asyncio.BlockingConnectionPool(
                connection_class=self._connection_class,
                max_connections=min(self._max_connections, 2 ** 16),
                timeout=self._connection_kwargs.get("socket_timeout") or 5,
                retry=Retry(NoBackoff(), 0), client_name=CLIENT_NAME,
                **self._connection_kwargs)
            client = self._clients[loop] = redis.asyncio.Redis(connection_pool=pool)
        return client

    async def take(self, bucket_keys, args, *, version_key):
        """``RedisStore.take``, awaited. Returns a TakeReply; raises StoreUnavailable."""
        client = self._client()
        # (a fallback store: its calls are not memoised)
        keys, args_sent, fold = folded_call(bucket_keys, args, version_key)
        try:
            try:
                reply = await client.evalsha(self._sha, len(keys), *keys, *args_sent)
            except NoScriptError:  # after a restart or SCRIPT FLUSH: the script did not run
                for source in self._sources:
                    await client.script_load(source)
                reply = await client.evalsha(self._sha, len(keys), *keys, *args_sent)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        reply = parse_take_reply(reply)
        return reply if fold is None else fold.unfold(reply)

    def run_while_waiting(self, work):
        """Nothing: redis.asyncio's client offers no gap between writing and reading (what
        ``work`` would fill is counted in the recorder's COUNT_BATCH batches instead)."""

    async def aclose(self):
        """Close the running loop's connections (before that loop ends)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose(close_connection_pool=True)


class ThreadedAsyncStore:
    """A sync store's ``take`` run in a worker thread, for stores without an async twin."""

    def __init__(self, store):
        self.store = store
        self.kind = store.kind
        self._take = sync_to_async(store.take, thread_sensitive=False)

    def run_while_waiting(self, work):
        """Nothing to add: the sync store runs its own (Store.run_while_waiting)."""

    async def take(self, bucket_keys, args, *, version_key):
        return await self._take(bucket_keys, args, version_key=version_key)

    async def aclose(self):
        """Nothing to close: the sync store owns its connections."""
