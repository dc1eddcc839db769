"""``RedisStore``: every bucket on one Redis node, reached through a django-redis cache alias.

One decision is one EVALSHA whatever the hierarchy's depth, and it reads the config version in
the same call. ``SentinelStore`` is this store behind django-redis's Sentinel client, plus what
redis-py's Sentinel pool leaves to its user (see the class).
"""

import time

from redis.exceptions import (
    ConnectionError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,  # redis-py's ConnectionError, not the builtin
)

from .base import (
    CHANGE_LOG_LENGTH,
    BalancesMissing,
    Store,
    StoreUnavailable,
    SupersededRules,
    TakeReply,
    script_source,
    settled_pairs,
)
from .ban_checks import folded_call
from .connections import HeldConnections

__all__ = ["RedisStore", "SentinelStore", "EncodedTakes", "parse_take_reply"]


def parse_take_reply(reply, with_version=True):
    """Return the TakeReply of a raw take.lua reply: ``{2, version, level, ...}`` when every
    bucket was debited (each result 1), else ``{allowed, version, level, result, ...}``.
    Raises SupersededRules for a fenced call's ``{3, version}``, BalancesMissing for a call
    that found credit balances missing (``{4, version, i, ...}``, 1-based)."""
    version = _text(reply[1]) if with_version else None
    status = reply[0]
    if status == 2:
        levels = reply[2:]
        return _new_reply(TakeReply, (True, version, levels, [1] * len(levels)))
    if status == 3:
        raise SupersededRules(_text(reply[1]))
    if status == 4:
        raise BalancesMissing([int(i) - 1 for i in reply[2:]])
    return _new_reply(TakeReply, (status == 1, version, reply[2::2], reply[3::2]))


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


_new_reply = tuple.__new__  # positionally, without the NamedTuple's Python-level __new__


# Encoded EVALSHA commands kept per store (one per bucket plan in use; cleared when full).
MAX_PACKED_COMMANDS = 4096


class EncodedTakes:
    """take.lua's EVALSHA as bytes on the wire, per (keys, args, version key): a decision's keys
    and arguments are the same request after request, so they are encoded once, with its ban
    checks folded (ban_checks.py). Only calls on the server's clock (``args[0] == b""``) are
    kept (a test clock's differ each time); at most MAX_PACKED_COMMANDS, then it starts afresh.
    ``encode`` packs a command tuple."""

    def __init__(self, encode):
        self.encode = encode
        self.commands = {}

    def command(self, sha, bucket_keys, args, version_key):
        """Return ``(command, fold)``: the encoded EVALSHA of ``sha`` for these keys and
        arguments (tuples), and the FoldedTake whose ``unfold`` its reply needs, or None."""
        memo_key = (bucket_keys, args, version_key)
        encoded = self.commands.get(memo_key)
        if encoded is None:
            keys, args_sent, fold = folded_call(bucket_keys, args, version_key)
            encoded = (self.encode(("EVALSHA", sha, len(keys), *keys, *args_sent)), fold)
            if args[0] == b"":  # the server's clock: the same bytes every time
                if len(self.commands) >= MAX_PACKED_COMMANDS:
                    self.commands.clear()
                self.commands[memo_key] = encoded
        return encoded


def encode_evalsha(sha, keys, args):
    """Return the EVALSHA of ``sha`` on ``keys`` (str) with ``args`` (bytes or int) as RESP
    bytes: what redis-py's packer writes, without its per-argument checks (a settle's
    arguments are built here, of known types: a third of its client-side cost went there)."""
    return EvalshaEncoder().encode(sha, keys, args)


# Encoded heads of EVALSHA commands kept per encoder (one per bucket plan settled; cleared when
# full)
MAX_ENCODED_HEADS = 4096


class EvalshaEncoder:
    """``encode_evalsha`` keeping the encoded head of each command shape (script, keys, number
    of arguments): a settle's keys are those of its bucket plan, the same request after
    request, so only its arguments are encoded each time."""

    def __init__(self):
        self.heads = {}

    def encode(self, sha, keys, args):
        """Return the EVALSHA of ``sha`` on ``keys`` (str) with ``args`` (bytes or int)."""
        keys = tuple(keys)  # (itself when it is one)
        shape = (sha, keys, len(args))
        head = self.heads.get(shape)
        if head is None:
            if len(self.heads) >= MAX_ENCODED_HEADS:
                self.heads.clear()
            parts = [b"EVALSHA", sha.encode(), b"%d" % len(keys),
                     *[key.encode() for key in keys]]
            head = self.heads[shape] = b"".join(
                [b"*%d\r\n" % (len(parts) + len(args)),
                 *[b"$%d\r\n%b\r\n" % (len(part), part) for part in parts]])
        return head + b"".join([b"$%d\r\n%b\r\n" % (len(arg), arg) if type(arg) is bytes
                                else b"$%d\r\n%d\r\n" % (len(b"%d" % arg), arg)
                                for arg in args])


class RedisStore(Store):
    """Buckets on one Redis node (a standalone server, or a master behind a proxy)."""

    kind = "redis"

    def __init__(self, client):
        self.client = client
        # register_script runs EVALSHA and reloads the script on NOSCRIPT (after a restart or
        # SCRIPT FLUSH), so the source is sent only when needed
        self._take = client.register_script(script_source("take"))
        self.encoded_takes = EncodedTakes(self._pack)
        self.evalsha_encoder = EvalshaEncoder()
        self._connections = HeldConnections(client.connection_pool)

    @classmethod
    def from_cache_alias(cls, alias):
        """Return the store on the redis-py client of django-redis cache ``alias``."""
        from django_redis import get_redis_connection

        return cls(get_redis_connection(alias))

    @property
    def take_sha(self):
        """The SHA1 of take.lua (for benchmarks that call it raw)."""
        return self._take.sha

    def take(self, bucket_keys, args, *, version_key):
        try:
            reply, fold = self._evalsha_take(tuple(bucket_keys), tuple(args), version_key)
        except RedisError as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc
        reply = parse_take_reply(reply)
        return reply if fold is None else fold.unfold(reply)

    def _evalsha_take(self, bucket_keys, args, version_key):
        """Send take.lua's EVALSHA, encoded once per (keys, args), on a pooled connection and
        return the raw reply with the FoldedTake to read it by (None: sent as built).

        The same call as redis-py's Script, without its per-command layers (argument encoding,
        retries, observability hooks, the pool's checkout: see HeldConnections): about two
        thirds of the client-side cost of a decision.
        No retry on purpose: a take whose reply was lost may have debited. NOSCRIPT (after a
        restart or SCRIPT FLUSH: the script did not run) loads the script and sends it again.
        """
        command, fold = self.encoded_takes.command(self._take.sha, bucket_keys, args,
                                                   version_key)
        try:
            return self._send(command), fold
        except NoScriptError:
            self.client.script_load(self._take.script)
            if self._settle is not None:  # settles are sent without waiting: see _settle_script
                self.client.script_load(self._settle.script)
            return self._send(command), fold

    def run_while_waiting(self, work):
        self._connections.while_waiting = work

    def _pack(self, command):
        """Encode ``command`` as the pool's connections would send it."""
        packer = self._packer
        if packer is None:
            # a connection of the pool's class and settings that is never connected: encoding
            # needs no socket, and checking one out of the pool would open one (a HELLO on
            # the wire) when the held connections have taken the pool's idle ones
            pool = self.client.connection_pool
            packer = self._packer = pool.connection_class(**pool.connection_kwargs)
        return packer.pack_command(*command)

    _packer = None

    def _send(self, command):
        """Send encoded ``command`` on a held connection; return its reply."""
        try:
            return self._connections.request(command)
        except OSError as exc:  # HeldConnections closed the socket
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc

    def close(self):
        """Give the connections held for decisions back to django-redis's pool."""
        self._connections.give_back()

    def release(self, slot_keys, member):
        """Release the concurrency slot ``member`` in ``slot_keys`` (release.lua: one call,
        idempotent). Returns the slots released; raises StoreUnavailable."""
        if self._release is None:
            self._release = self.client.register_script(script_source("release"))
        return self._call(self._release, list(slot_keys), [member])

    _release = None

    def settle(self, bucket_keys, args):
        settle = self._settle_script()
        return settled_pairs(self._call(self._evalsha_once, settle, bucket_keys, args))

    def _settle_script(self):
        """settle.lua, loaded into Redis at this store's first settle (raises StoreUnavailable).

        A settle sent without waiting (settle_later) that meets NOSCRIPT is sent again only
        once its reply is read: at the worker's next call or metrics flush, or never if the
        worker dies first. So the script is loaded before the first one is sent, and again
        whenever a take meets NOSCRIPT (a Redis restarted or flushed); what is left is a Redis
        that lost its scripts between a request's take and its settle."""
        if self._settle is None:
            settle = self.client.register_script(script_source("settle"))
            # on a held connection: the client's own script_load would open one more
            self._call(self._send, self._pack(("SCRIPT", "LOAD", settle.script)))
            self._settle = settle
        return self._settle

    def settle_later(self, bucket_keys, args, on_settled):
        settle = self._settle_script()
        command = [self.evalsha_encoder.encode(settle.sha, bucket_keys, args)]

        def on_reply(reply):
            if isinstance(reply, BaseException) and \
                    _caused_by(reply, (NoScriptError, ReadOnlyError)):
                # it did not run (scripts lost since the last take, a master demoted): sent
                # again, waiting for its reply this time (settle loads the script on NOSCRIPT)
                try:
                    reply = self.settle(bucket_keys, args)
                except StoreUnavailable as exc:
                    reply = exc
            elif isinstance(reply, BaseException):
                # a lost reply: the settle may have applied; never sent twice
                reply = StoreUnavailable(f"{type(reply).__name__}: {reply}")
            else:
                reply = settled_pairs(reply)
            on_settled(reply)

        try:
            self._connections.send_unanswered(command, on_reply)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def collect_unanswered(self):
        self._connections.collect()

    def _evalsha_once(self, script, keys, args):
        """Send ``script``'s EVALSHA on a held connection, as a take is sent: never retried
        (redis-py's client may retry a command whose reply was lost, and a settle is not
        idempotent); NOSCRIPT (the script did not run) loads it and sends it again. ``keys``
        are str, ``args`` bytes or int."""
        command = [self.evalsha_encoder.encode(script.sha, keys, args)]
        try:
            return self._send(command)
        except NoScriptError:
            self.client.script_load(script.script)
            return self._send(command)

    _settle = None

    def read_version(self, version_key):
        value = self._call(self.client.get, version_key)
        return value.decode() if value else "0"

    def write_version(self, version_key, value, changes=None):
        if changes is None:
            self._call(self.client.set, version_key, value)
            return
        changes_key, entry = changes

        def publish():  # one MULTI: the record and the version together
            pipeline = self.client.pipeline(transaction=True)
            pipeline.lpush(changes_key, entry)
            pipeline.ltrim(changes_key, 0, CHANGE_LOG_LENGTH - 1)
            pipeline.set(version_key, value)
            pipeline.execute()

        self._call(publish)

    def read_changes(self, changes_key):
        return [entry.decode() for entry in self._call(self.client.lrange, changes_key, 0, -1)]

    def record_change(self, changes_key, entry):
        def record():
            pipeline = self.client.pipeline(transaction=True)
            pipeline.lpush(changes_key, entry)
            pipeline.ltrim(changes_key, 0, CHANGE_LOG_LENGTH - 1)
            pipeline.execute()

        self._call(record)

    def newest_change(self, changes_key):
        entry = self._call(self.client.lindex, changes_key, 0)
        return None if entry is None else entry.decode()

    def delete(self, keys):
        return self._call(self.client.delete, *keys) if keys else 0

    def claim(self, key, ttl_ms):
        return bool(self._call(lambda: self.client.set(key, b"1", nx=True, px=ttl_ms)))

    def scan(self, pattern):
        try:
            yield from self.client.scan_iter(match=pattern, count=1000)
        except RedisError as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def metrics_client(self):
        return self.client

    def ping(self):
        self._call(self.client.ping)

    def problems(self):
        try:
            info = self.client.info("cluster")
            if info.get("cluster_enabled"):
                return [f"{self._where()} is a Redis Cluster node: one decision's buckets span "
                        f"several slots there (CROSSSLOT). Use the cluster store "
                        f"(RATELIMIT_APP['CLUSTER_NODES'])."]
            # a bucket-less call: proves EVALSHA (or EVAL, after NOSCRIPT) is allowed
            self._take(keys=["ratelimit_app:check:version"], args=[b"", b"0"])
        except ResponseError as exc:
            return [f"{self._where()} refuses the limiter's script: {exc}"]
        except RedisError as exc:
            return [f"{self._where()} cannot be reached: {type(exc).__name__}: {exc}"]
        return []

    def _where(self):
        kwargs = self.client.connection_pool.connection_kwargs
        if "host" in kwargs:
            return f"Redis at {kwargs['host']}:{kwargs.get('port', 6379)}"
        return f"Redis at {kwargs.get('path', 'its socket')}"

    def _call(self, method, *args):
        try:
            return method(*args)
        except RedisError as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc


class SentinelStore(RedisStore):
    """Buckets on the master of a Sentinel-watched group, through django-redis's
    ``SentinelClient`` (its pool is redis-py's ``SentinelConnectionPool``).

    What redis-py does: every new connection asks the sentinels for the master; a connection
    whose server died is reopened that way; a READONLY reply on a master connection closes it
    and raises ConnectionError. What it leaves to us, done here:

    - An open connection to a master that the sentinels no longer name (a manual failover, a
      partition) keeps working there: writes that will be discarded when it is demoted, among
      them config version bumps. So at most once per ``master_check_interval_s`` the store asks
      the sentinels; when the master moved, the pool closes its idle connections to the old
      one, and the connections held for decisions are given back to be closed.
    - A call refused with READONLY wrote nothing (the node is a replica now), so it is sent
      once more, to the master the sentinels name, instead of failing a decision.

    The seconds in which no master can be named are the Limiter's: breaker and fail modes.
    """

    kind = "sentinel"

    def __init__(self, client, master_check_interval_s=1.0):
        super().__init__(client)
        self.master_check_interval_s = master_check_interval_s
        self._next_master_check = 0.0

    def take(self, bucket_keys, args, *, version_key):
        return self._on_master(super().take, bucket_keys, args, version_key=version_key)

    def _call(self, method, *args):
        return self._on_master(super()._call, method, *args)

    def settle_later(self, bucket_keys, args, on_settled):
        if time.monotonic() >= self._next_master_check:
            self.follow_master()
        super().settle_later(bucket_keys, args, on_settled)

    def _on_master(self, operation, *args, **kwargs):
        """Run ``operation`` (which raises StoreUnavailable) on the current master; again once
        if the node answered READONLY."""
        if time.monotonic() >= self._next_master_check:
            self.follow_master()
        try:
            return operation(*args, **kwargs)
        except StoreUnavailable as exc:
            if not _caused_by(exc, ReadOnlyError):
                raise
        self.follow_master()
        return operation(*args, **kwargs)

    def follow_master(self):
        """Ask the sentinels for the master; if it moved, the pool drops its idle connections
        to the old one. Returns the master's ``(host, port)``, or None when no sentinel names
        one (the open connections are then kept: a master that answers is still the best bet)."""
        self._next_master_check = time.monotonic() + self.master_check_interval_s
        try:
            address = self.client.connection_pool.get_master_address()
        except RedisError:
            return None
        self._connections.release_unowned()  # those to a master the sentinels no longer name
        return address

    def _where(self):
        pool = self.client.connection_pool
        sentinels = ", ".join(
            "{host}:{port}".format_map(sentinel.connection_pool.connection_kwargs)
            for sentinel in pool.sentinel_manager.sentinels)
        return f"the Sentinel master {pool.service_name!r} (sentinels {sentinels})"


def _caused_by(error, error_class):
    """True when ``error`` or an exception in its chain (cause or context) is an
    ``error_class`` (a class or a tuple of them): redis-py turns READONLY into a
    ConnectionError raised while handling it."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, error_class):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
