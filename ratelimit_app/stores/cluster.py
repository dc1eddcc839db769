"""``ClusterStore``: buckets on a Redis Cluster, through redis-py's ``RedisCluster``.

One identity's buckets share a ``{tag}`` (one slot), so a decision's buckets fall into a few
slot groups (e.g. global, plan, client). Each group is one take.lua call on the master of its
slot; several groups are hand-pipelined: every group's EVALSHA is written on its node's
connection, then every reply is read (bench/cluster_fanout.py: 0.45× the time of sequential
calls; threads and FCALL were slower). Nodes and connections come from the RedisCluster's slot
map and pools, so its redirect handling and topology refreshes keep working.

All-or-nothing across groups, never over-granting: take.lua debits a group only if all its
buckets hold the cost. When one group refuses (or fails) while others debited, those debits are
given back by refund.lua: idempotent (one refund id per decision, a SET NX marker in the
buckets' slot) and never above a bucket's capacity. A group whose outcome is unknown (a timeout
after its command was sent) is never refunded: refunding a debit that did not happen would
over-grant.

The config version key lives in one slot, and a script may read only keys of its own slot; so
the version is copied into every slot (``version_copy_key``: 16,384 small keys, about 1.5 MB
over the masters), written before the version key itself whenever a version is published
(``write_version``). Each group call reads its slot's copy and is fenced on it (take.lua): once
a version is published, a call carrying rules of an older one debits nothing in any slot, and
the decision is refused as a whole (the other groups' debits refunded) and made again on fresh
rules. A copy that a failover or a node restart lost is rewritten by the Limiter (see
``Limiter._fresher_snapshot``). Replies have ``version=None``: a copy is not the version of
record, which the Limiter's watcher polls.
"""

import binascii
import functools
import secrets
import threading

from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)  # ConnectionError and TimeoutError: redis-py's, not the builtins

from .base import (
    CHANGE_LOG_LENGTH,
    TAKE_HEAD,
    BalancesMissing,
    Store,
    StoreUnavailable,
    SupersededRules,
    TakeReply,
    script_sha,
    script_source,
    settled_pairs,
    store_error,
)
from .ban_checks import folded_call
from .redis import parse_take_reply

__all__ = ["ClusterStore", "parse_nodes", "version_copy_key"]

# take.lua's and refund.lua's arguments: a head (take: now, debit flag), then 1 per bucket
# (settle.lua's head is now alone)
HEAD, PER_BUCKET = TAKE_HEAD, 1
# A refund marker outlives any retry of that refund by far, and then vanishes.
REFUND_MARKER_TTL_MS = 10_000
# Error replies that mean "not run here, ask the cluster where": redo through RedisCluster.
_REDIRECTS = (AskError, TryAgainError, ClusterDownError)
_CLIENT_ERRORS = (RedisError, RedisClusterException)


class _Script:
    """A Lua script by name: its source and SHA1 (loaded on a node only when it says NOSCRIPT)."""

    def __init__(self, name):
        self.source = script_source(name)
        self.sha = script_sha(name)


class _Call:
    """One script call on the keys of one slot; after ``_run`` either ``reply`` or ``error``
    is set (an error after sending leaves the outcome unknown: such a call is never refunded)."""

    __slots__ = ("args", "error", "keys", "reply", "slot")

    def __init__(self, slot, keys, args):
        self.slot, self.keys, self.args = slot, keys, args
        self.reply = self.error = None


def parse_nodes(nodes):
    """Return ``ClusterNode``s for ``"host:port"`` strings (``"[::1]:7000"`` for IPv6)."""
    parsed = []
    for node in nodes:
        host, _, port = str(node).rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"CLUSTER_NODES holds {node!r}; write each node as 'host:port'")
        parsed.append(ClusterNode(host.strip("[]"), int(port)))
    return parsed


SLOTS = 16384
# KEYS[1] = ARGV[2] if it holds ARGV[1] (a version key moved by nobody else meanwhile; a
# missing key holds "0", as read_version says); returns what KEYS[1] holds then
_SET_IF_EQUAL = ("local held = redis.call('GET', KEYS[1]) or '0' "
                 "if held == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return ARGV[2] end "
                 "return held")


@functools.cache
def slot_tags():
    """Return a hash tag for every slot (``tags[slot]`` hashes to ``slot``): the shortest
    decimal strings that do, found once per process (about 170,000 CRC16s, ~0.1 s)."""
    tags, missing, number = [None] * SLOTS, SLOTS, 0
    while missing:
        tag = str(number)
        slot = binascii.crc_hqx(tag.encode(), 0) % SLOTS
        if tags[slot] is None:
            tags[slot], missing = tag, missing - 1
        number += 1
    return tuple(tags)


def version_copy_key(version_key, slot):
    """Return the key of the config version's copy in ``slot``."""
    return f"{version_key}:{{{slot_tags()[slot]}}}"


def marker_key(bucket_key, refund_id):
    """Return the refund marker key for ``refund_id`` in the slot of ``bucket_key``: same
    ``{tag}``, or (an untagged key) the whole key as the tag."""
    start = bucket_key.find("{")
    end = bucket_key.find("}", start + 1) if start >= 0 else -1
    if end > start + 1:
        return f"{bucket_key[:end + 1]}:refund:{refund_id}"
    return f"{{{bucket_key}}}:refund:{refund_id}"


class ClusterStore(Store):
    """Buckets on a Redis Cluster. ``client`` is a ``redis.cluster.RedisCluster``, or a callable
    returning one: it is then built on first use, so a cluster that is down when the process
    starts gives StoreUnavailable (and the rules' fail modes), not a crash."""

    kind = "cluster"
    versions_copied = True

    def __init__(self, client):
        self._client = None if callable(client) and not isinstance(client, RedisCluster) \
            else client
        self._connect = client if self._client is None else None
        self._connect_lock = threading.Lock()
        self._take = _Script("take")
        self._refund = _Script("refund")
        self._settle = _Script("settle")
        self._copy_version = _Script("copy_version")
        self._while_waiting = None  # see run_while_waiting

    @classmethod
    def from_nodes(cls, nodes, options=None):
        """Return the store on the cluster that any of ``nodes`` ("host:port") belongs to;
        ``options`` are RedisCluster keyword arguments (socket timeouts, retries, TLS)."""
        startup_nodes = parse_nodes(nodes)
        options = dict(options or {})
        return cls(lambda: RedisCluster(startup_nodes=startup_nodes, **options))

    @property
    def client(self):
        """The RedisCluster (built on first use). Raises StoreUnavailable while unreachable."""
        client = self._client
        if client is None:
            with self._connect_lock:
                if self._client is None:
                    try:
                        self._client = self._connect()
                    except _CLIENT_ERRORS as exc:
                        raise StoreUnavailable(
                            f"Redis Cluster cannot be reached: {type(exc).__name__}: {exc}"
                        ) from exc
                client = self._client
        return client

    @property
    def take_sha(self):
        """The SHA1 of take.lua (for benchmarks that call it raw)."""
        return self._take.sha

    # --- decisions ---------------------------------------------------------------------------

    def run_while_waiting(self, work):
        self._while_waiting = work  # run once a call's commands are written, before its replies

    def take(self, bucket_keys, args, *, version_key):
        client = self.client
        head, calls, positions, folds = args[:HEAD], [], [], []
        for slot, indices in _group_by_slot(bucket_keys).items():
            # a group's ban checks ride on one of its buckets (ban_checks.py): all its keys
            # are in one slot
            keys, group_args, fold = folded_call([bucket_keys[i] for i in indices],
                                                 [*head, *_bucket_args(args, indices)],
                                                 version_copy_key(version_key, slot))
            calls.append(_Call(slot, list(keys), list(group_args)))
            positions.append(indices)
            folds.append(fold)
        self._run(client, self._take, calls)

        replies, superseded, missing = [], None, []
        for call, indices, fold in zip(calls, positions, folds):
            reply = None
            if call.reply is not None:
                try:
                    reply = parse_take_reply(call.reply, False)
                    if fold is not None:
                        reply = fold.unfold(reply)
                except SupersededRules as exc:
                    superseded = exc  # this group debited nothing
                except BalancesMissing as exc:  # nor this one: its balances are to be seeded
                    missing.extend(indices[n] for n in exc.positions)
            replies.append(reply)
        failed = [call for call in calls if call.reply is None]
        allowed = not failed and superseded is None and not missing and \
            all(reply.allowed for reply in replies)
        if not allowed:
            self._refund_debits(client, calls, replies, positions, bucket_keys, args)
        if failed:
            raise store_error(failed[0].error) from failed[0].error
        if superseded is not None:
            raise superseded
        if missing:
            raise BalancesMissing(sorted(missing))

        levels, results = [0] * len(bucket_keys), [0] * len(bucket_keys)
        for indices, reply in zip(positions, replies):
            for i, level, result in zip(indices, reply.levels, reply.results):
                levels[i], results[i] = level, result
        return TakeReply(allowed, None, levels, results)

    def _refund_debits(self, client, calls, replies, positions, bucket_keys, args):
        """Give back every debit of a decision that is refused (or failed) as a whole, and
        write the levels after the refund into ``replies`` (results 0: held the cost, not
        debited). A group without a reply is never refunded (its outcome is unknown)."""
        refund_id = secrets.token_hex(8)
        refunds = []  # (reply, indices within that reply)
        refund_calls = []
        for call, reply, indices in zip(calls, replies, positions):
            if reply is None:
                continue
            debited = [n for n, result in enumerate(reply.results) if result == 1]
            if debited:
                keys = [bucket_keys[indices[n]] for n in debited]
                refund_calls.append(_Call(call.slot, [*keys, marker_key(keys[0], refund_id)],
                                          [REFUND_MARKER_TTL_MS,
                                           *_bucket_args(args, [indices[n] for n in debited])]))
                refunds.append((reply, debited))
        if not refund_calls:
            return
        # one retry with the same id: a refund whose reply was lost may have been applied, and
        # the marker makes the second attempt add nothing
        self._run(client, self._refund, refund_calls)
        retry = [call for call in refund_calls if call.reply is None]
        if retry:
            for call in retry:
                call.error = None
            self._run(client, self._refund, retry)
        for call, (reply, debited) in zip(refund_calls, refunds):
            if call.reply is None:
                # the debit stays (an under-grant until the bucket refills, never an over-grant)
                raise store_error(call.error) from call.error
            for n, level in zip(debited, call.reply):
                reply.levels[n], reply.results[n] = level, 0

    def refund(self, bucket_keys, args, *, refund_id):
        """Give back the cost of ``bucket_keys`` (``args`` as for take) once per ``refund_id``,
        never above capacity; return their levels after the call. Raises StoreUnavailable."""
        client = self.client
        calls, positions = [], []
        for slot, indices in _group_by_slot(bucket_keys).items():
            keys = [bucket_keys[i] for i in indices]
            calls.append(_Call(slot, [*keys, marker_key(keys[0], refund_id)],
                               [REFUND_MARKER_TTL_MS, *_bucket_args(args, indices)]))
            positions.append(indices)
        self._run(client, self._refund, calls)
        return _levels_in_order(calls, positions, len(bucket_keys))

    def settle(self, bucket_keys, args):
        """settle.lua once per slot group, on the groups' masters at once. A group whose call
        failed is not settled (the others are): raises StoreUnavailable then."""
        calls, positions = [], []
        for slot, indices in _group_by_slot(bucket_keys).items():
            calls.append(_Call(slot, [bucket_keys[i] for i in indices],
                               [args[0], *_bucket_args(args, indices, head=1)]))
            positions.append(indices)
        self._run(self.client, self._settle, calls)
        for call in calls:
            if call.reply is not None:
                call.reply = settled_pairs(call.reply)
        return _levels_in_order(calls, positions, len(bucket_keys))

    # --- running script calls on their slots' masters ----------------------------------------

    def _run(self, client, script, calls):
        """Run ``script`` for every call: write each EVALSHA on the connection of its slot's
        master, then read every reply. Calls that did not run there (not sent, NOSCRIPT, a
        redirect) are redone one by one through RedisCluster. Sets each call's reply or error;
        raises nothing but interrupts."""
        sent, redo = [], []
        for call in calls:
            try:
                node = client.get_redis_connection(
                    client.nodes_manager.get_node_from_slot(call.slot))
                connection = node.connection_pool.get_connection()
            except _CLIENT_ERRORS:
                redo.append(call)  # no connection: nothing was sent
                continue
            try:
                connection.send_command("EVALSHA", script.sha, len(call.keys), *call.keys,
                                        *call.args)
            except RedisError:
                # a command is written whole or Redis drops the half it got: not run
                connection.disconnect()
                node.connection_pool.release(connection)
                redo.append(call)
                continue
            sent.append((call, node, connection))
        if sent and self._while_waiting is not None:
            self._while_waiting()  # the masters are running the calls meanwhile

        unread = [connection for _, _, connection in sent]
        try:
            for call, node, connection in sent:
                try:
                    call.reply = node.parse_response(connection, "EVALSHA")
                except NoScriptError:
                    # e.g. a replica promoted since the script was loaded: it did not run
                    self._load(node, script, call)
                    redo.append(call)
                except _REDIRECTS:
                    redo.append(call)  # MOVED/ASK/TRYAGAIN/CLUSTERDOWN: it did not run
                except (ConnectionError, TimeoutError) as exc:
                    call.error = exc  # sent, no answer: it may have run; never refunded
                    connection.disconnect()
                except ResponseError as exc:
                    call.error = exc  # refused (ACL, CROSSSLOT, wrong type): it did not run
                except RedisError as exc:
                    call.error = exc  # a garbled reply: treated as unknown, like a timeout
                    connection.disconnect()
                unread.remove(connection)
        finally:
            for call, node, connection in sent:
                if connection in unread:  # interrupted: replies may be left on the socket
                    connection.disconnect()
                node.connection_pool.release(connection)

        for call in redo:
            if call.error is None:
                self._run_through_client(client, script, call)

    @staticmethod
    def _load(node, script, call):
        try:
            node.script_load(script.source)
        except RedisError as exc:
            call.error = exc

    def _run_through_client(self, client, script, call):
        """Run one call through RedisCluster.evalsha, which follows MOVED/ASK and refreshes the
        slot map after connection errors; load the script on every master after NOSCRIPT."""
        command = (script.sha, len(call.keys), *call.keys, *call.args)
        try:
            try:
                call.reply = client.evalsha(*command)
            except NoScriptError:
                client.script_load(script.source)  # on every primary
                call.reply = client.evalsha(*command)
        except _CLIENT_ERRORS as exc:
            call.error = exc

    # --- the rest of the interface -----------------------------------------------------------

    def release(self, slot_keys, member):
        """Release the concurrency slot ``member`` in ``slot_keys`` (a ZREM per key: each on
        its slot's master; idempotent). Returns the slots released; raises StoreUnavailable."""
        return sum(self._call(lambda client, key=key: client.zrem(key, member)) for key in slot_keys)

    def read_version(self, version_key):
        value = self._call(lambda client: client.get(version_key))
        return value.decode() if value else "0"

    def write_version(self, version_key, value, changes=None):
        """Write the record of changes, then ``value`` into every slot's copy of the version,
        then the version key: a call fenced by a copy finds what the version changed, and by
        the time the version is published, every fenced call compares with it."""
        def write(client):
            self._write_copies(client, version_key, value)
            client.set(version_key, value)

        if changes is not None:
            self.record_change(*changes)
        self._call(write)

    def finish_publication(self, version_key, expected, value):
        def finish(client):
            held = client.eval(_SET_IF_EQUAL, 1, version_key, expected, value).decode()
            if held != "0":  # no version at all: no copy to write
                self._write_copies(client, version_key, held)

        self._call(finish)

    def write_version_copies(self, version_key, value):
        self._call(lambda client: self._write_copies(client, version_key, value))

    def _write_copies(self, client, version_key, value):
        """Set every slot's copy of the version (never back to an older one): one
        copy_version.lua call per master for the slots it serves (76 ms for 16,384 copies over
        3 masters on a loaded 2-core machine, against 0.6 s through a pipeline of SETs); a
        master whose call fails (a slot moved meanwhile) has its copies written through a
        pipeline, which follows redirects."""
        by_node = {}
        for slot in range(SLOTS):
            node = client.nodes_manager.get_node_from_slot(slot)
            by_node.setdefault(node.name, (node, []))[1].append(
                version_copy_key(version_key, slot))
        left = []
        for node, copies in by_node.values():
            redis_node = client.get_redis_connection(node)
            try:
                try:
                    redis_node.evalsha(self._copy_version.sha, 0, value, *copies)
                except NoScriptError:
                    redis_node.script_load(self._copy_version.source)
                    redis_node.evalsha(self._copy_version.sha, 0, value, *copies)
            except RedisError:
                left.extend(copies)
        if left:
            pipeline = client.pipeline(transaction=False)
            for key in left:
                pipeline.set(key, value)
            pipeline.execute()

    def read_changes(self, changes_key):
        return [entry.decode() for entry in
                self._call(lambda client: client.lrange(changes_key, 0, -1))]

    def record_change(self, changes_key, entry):
        def record(client):
            pipeline = client.pipeline(transaction=False)  # one key: one MULTI-less batch
            pipeline.lpush(changes_key, entry)
            pipeline.ltrim(changes_key, 0, CHANGE_LOG_LENGTH - 1)
            pipeline.execute()

        self._call(record)

    def newest_change(self, changes_key):
        entry = self._call(lambda client: client.lindex(changes_key, 0))
        return None if entry is None else entry.decode()

    def claim(self, key, ttl_ms):
        return bool(self._call(lambda client: client.set(key, b"1", nx=True, px=ttl_ms)))

    def delete(self, keys):
        # one identity's keys share a slot: one DEL; keys of several slots: one DEL per slot
        groups = _group_by_slot(keys).values()
        return self._call(lambda client: sum(
            client.delete(*[keys[i] for i in indices]) for indices in groups))

    def scan(self, pattern):
        client = self.client
        try:
            for node in client.get_primaries():
                yield from client.get_redis_connection(node).scan_iter(match=pattern, count=1000)
        except _CLIENT_ERRORS as exc:
            raise store_error(exc) from exc

    def metrics_client(self):
        """The RedisCluster: its non-transactional pipeline sends each node its commands."""
        return self.client

    def close(self):
        """Close the RedisCluster's connections to every node (a replaced Limiter's store)."""
        if self._client is not None:
            self._client.close()

    def ping(self):
        self._call(lambda client: client.ping(target_nodes=RedisCluster.PRIMARIES))

    def problems(self):
        try:
            client = self.client
            primaries = client.get_primaries()
        except StoreUnavailable as exc:
            return [str(exc)]
        except _CLIENT_ERRORS as exc:
            return [f"Redis Cluster cannot be reached: {type(exc).__name__}: {exc}"]
        found = []
        for node in primaries:
            where = f"Redis Cluster node {node.name}"
            try:
                state = client.cluster_info(target_nodes=node).get("cluster_state")
                if state != "ok":
                    found.append(f"{where} says cluster_state:{state}; some slots cannot be "
                                 f"served.")
                    continue
                # a bucket-less take on a key this node serves: proves EVALSHA is allowed
                command = (self._take.sha, 1, _key_served_by(client, node), b"", b"0")
                redis_node = client.get_redis_connection(node)
                try:
                    redis_node.evalsha(*command)
                except NoScriptError:
                    redis_node.script_load(self._take.source)
                    redis_node.evalsha(*command)
            except ResponseError as exc:
                found.append(f"{where} refuses the limiter's script: {exc}")
            except _CLIENT_ERRORS as exc:
                found.append(f"{where} cannot be reached: {type(exc).__name__}: {exc}")
        return found

    def _call(self, operation):
        client = self.client
        try:
            return operation(client)
        except _CLIENT_ERRORS as exc:
            raise store_error(exc) from exc


def _group_by_slot(keys):
    """Return ``{slot: [indices of keys in that slot]}`` in the keys' order."""
    groups = {}
    for index, key in enumerate(keys):
        groups.setdefault(key_slot(key.encode() if isinstance(key, str) else key), []) \
            .append(index)
    return groups


def _levels_in_order(calls, positions, count):
    """Return the levels ``calls`` (one per slot group, each of the bucket indices in
    ``positions``) replied, in the buckets' order; raise StoreUnavailable for a call that got
    no reply."""
    levels = [0] * count
    for call, indices in zip(calls, positions):
        if call.reply is None:
            raise store_error(call.error) from call.error
        for i, level in zip(indices, call.reply):
            levels[i] = level
    return levels


def _bucket_args(args, indices, head=HEAD):
    """Return the script arguments of each bucket in ``indices`` (``args`` as for take: a head
    of ``head`` arguments, then ``PER_BUCKET`` per bucket)."""
    picked = []
    for i in indices:
        start = head + i * PER_BUCKET
        picked.extend(args[start:start + PER_BUCKET])
    return picked


def _key_served_by(client, node):
    """Return a key (for the script check) in a slot that ``node`` serves."""
    for n in range(100_000):
        key = f"ratelimit_app:check:{{{n}}}"
        if client.nodes_manager.get_node_from_slot(key_slot(key.encode())).name == node.name:
            return key
    raise LookupError(f"no slot of {node.name} found")
