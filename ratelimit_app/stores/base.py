"""What every store offers the Limiter, and the one error it raises.

A store holds the buckets and the config version. It does no policy work: it runs the scripts on
the keys and arguments it is given and reports what Redis answered. Every Redis failure leaves a
store as :class:`StoreUnavailable`; the Limiter decides between fail-open and fail-closed.
"""

import hashlib
from importlib import resources
from typing import NamedTuple

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterError,
    MasterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)

__all__ = [
    "BalancesMissing",
    "Store",
    "StoreMisconfigured",
    "StoreUnavailable",
    "SupersededRules",
    "TakeReply",
    "is_misconfiguration",
    "reply_code",
    "script_source",
    "settled_pairs",
    "store_error",
    "READ_ERRORS",
    "TAKE_HEAD",
]

# take.lua's arguments before the buckets' specs: now, the debit flag
TAKE_HEAD = 2


# How many published versions the record of changes keeps (see Store.write_version): a worker
# more versions behind compiles everything.
CHANGE_LOG_LENGTH = 100


class StoreUnavailable(Exception):
    """The store could not give an answer (down, slow, restarting, or refusing the script)."""


class SupersededRules(Exception):
    """A fenced take found another config version in the store than the one its rules were
    compiled from, and debited nothing: the caller decides again on fresh rules. ``version``
    is the version the store holds (in the slot the call ran in, on a Cluster)."""

    def __init__(self, version):
        super().__init__(f"the rules were superseded by config version {version}")
        self.version = version

class BalancesMissing(Exception):
    """A take found credit balances without a value (their first use, or Redis lost them) and
    debited nothing: the caller seeds them from the ledger and takes again. ``positions`` are
    the balances' indices among the call's buckets (0-based)."""

    def __init__(self, positions):
        super().__init__(f"credit balances missing at positions {positions}")
        self.positions = positions



# What a read or write straight through a store's client (the metrics, the dashboard) may raise
# when Redis cannot answer: redis-py's errors, the cluster client's own (a slot not covered is
# not a RedisError), and a store that could not even build its client.
READ_ERRORS = (RedisError, RedisClusterException, StoreUnavailable)


class StoreMisconfigured(StoreUnavailable):
    """Redis answered, but refuses what the limiter sends and will go on refusing it: the wrong
    kind of Redis (CROSSSLOT on a cluster node), an ACL without EVALSHA (NOPERM), a key of the
    wrong type. Waiting does not cure it; an operator must."""


# Error replies that a retry (or a failover finishing) cures: redirects, a cluster or master
# in transition, a node loading its data or busy running a script, too few replicas in sync
# for a write, a script cache emptied by a restart. Known by the code a reply starts with,
# never by its words, which servers change (Valkey answers "NOSCRIPT No matching script.",
# Redis 7 adds "Please use EVAL."). redis-py raises some codes as classes of their own (and
# drops the code from the message); the rest are a ResponseError whose message starts with it.
_TRANSIENT_REPLIES = (AskError, ClusterError, TryAgainError, BusyLoadingError, MasterDownError,
                      ReadOnlyError, NoScriptError)
_TRANSIENT_CODES = frozenset({"BUSY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
                              "NOREPLICAS"})


def reply_code(error):
    """The code of an error reply redis-py raised as a plain ResponseError: the message's first
    word ("BUSY", "BUSYKEY", "WRONGTYPE", "ERR")."""
    return str(error).split(" ", 1)[0]


def is_misconfiguration(error):
    """Return whether ``error`` (a Redis error, or a StoreUnavailable raised from one) is a
    refusal that retrying cannot cure."""
    if isinstance(error, StoreMisconfigured):
        return True
    if isinstance(error, StoreUnavailable):
        error = error.__cause__
    return (isinstance(error, ResponseError) and not isinstance(error, _TRANSIENT_REPLIES)
            and reply_code(error) not in _TRANSIENT_CODES)


def store_error(error):
    """Return the StoreUnavailable (or StoreMisconfigured) to raise ``from`` a Redis error."""
    kind = StoreMisconfigured if is_misconfiguration(error) else StoreUnavailable
    return kind(f"{type(error).__name__}: {error}")


class TakeReply(NamedTuple):
    """What take.lua answered for a decision's buckets (lists in the buckets' order).

    ``levels`` are the buckets' units after the call; ``results`` 1 = debited, 0 = held the
    cost but not debited, -1 = short of it. ``version`` is the config version read in the same
    call, or None when the store could not read it there (a Cluster slot without the key).
    """

    allowed: bool
    version: str | None
    levels: list
    results: list


def script_source(name):
    """Return the text of ``lua/<name>.lua`` shipped with the package."""
    return resources.files("ratelimit_app.stores").joinpath(f"lua/{name}.lua").read_text()


def script_sha(name):
    """Return the SHA1 Redis knows ``lua/<name>.lua`` by (EVALSHA, SCRIPT EXISTS)."""
    return hashlib.sha1(script_source(name).encode()).hexdigest()


class Store:
    """The interface the Limiter uses. Subclasses own their client and their scripts."""

    #: shown on the dashboard and in ``manage.py check``
    kind = "abstract"

    def take(self, bucket_keys, args, *, version_key):
        """Run take.lua for one decision and return a TakeReply.

        ``bucket_keys`` and ``args`` are as take.lua documents them (``args`` begins with now
        and the debit flag, maybe fenced, then one spec per bucket); ``version_key`` is the
        config version counter, read in the same call (on a Cluster, its copy in the slot of
        each call). Raises SupersededRules when a fenced call found another version.
        """
        raise NotImplementedError

    def run_while_waiting(self, work):
        """Run ``work`` (a callable that must not raise) in each decision's wait for its reply,
        where the store can tell that gap apart (the default cannot: ``work`` never runs)."""

    def settle(self, bucket_keys, args):
        """Run settle.lua once (one call per slot group on a Cluster; never retried: a call
        whose reply was lost may have been applied): add what a request really cost beyond
        (or short of) its debit to ``bucket_keys``. ``args`` are as settle.lua documents them
        (now, then one spec and difference per bucket). Returns ``(level, charged)`` per key,
        in the keys' order: the level after the call, and the units it charged a credit balance
        (``settled_pairs``). Raises StoreUnavailable."""
        raise NotImplementedError

    def settle_later(self, bucket_keys, args, on_settled):
        """``settle`` without waiting for its reply where the store can: the call is sent
        now (Redis applies it as it arrives), and ``on_settled`` is called with what
        ``settle`` returns, or the StoreUnavailable it raises, once the reply is read (see
        HeldConnections.send_unanswered), in whichever thread reads it. This default waits
        (a Cluster's calls, one per slot group). Raises StoreUnavailable when nothing could
        be sent (``on_settled`` is then not called)."""
        try:
            settled = self.settle(bucket_keys, args)
        except StoreUnavailable as exc:
            on_settled(exc)
            return
        on_settled(settled)

    def collect_unanswered(self):
        """Read the replies of calls sent without waiting (``settle_later``) that are still
        unread, and hand them on; nothing where every call waits for its reply."""

    def release(self, slot_keys, member):
        """Release a request's concurrency slot ``member`` (bytes) in ``slot_keys``, idempotently.
        Raises StoreUnavailable."""
        raise NotImplementedError

    def read_version(self, version_key):
        """Return the config version ("0" when unset)."""
        raise NotImplementedError

    def write_version(self, version_key, value, changes=None):
        """Set the config version to ``value`` (on a Cluster, its copy in every slot first).
        ``changes``: ``(changes key, entry)``, an entry saying which tables the version changed,
        pushed onto that list (the newest CHANGE_LOG_LENGTH kept) before the version is set."""
        raise NotImplementedError

    def finish_publication(self, version_key, expected, value):
        """Set the version key to ``value`` if it holds ``expected``, and its copies (never to
        an older version); nothing where the version is not copied."""

    def write_version_copies(self, version_key, value):
        """Rewrite the copies of the version (a Cluster's, one per slot) with ``value``, not the
        version key itself; nothing where the version is not copied."""

    def read_changes(self, changes_key):
        """Return the entries of the record of changes, newest first (str)."""
        raise NotImplementedError

    def record_change(self, changes_key, entry):
        """Push ``entry`` onto the record of changes (the newest CHANGE_LOG_LENGTH kept), ahead
        of the version it names: a publication with a lead (config/versions.py)."""
        raise NotImplementedError

    def newest_change(self, changes_key):
        """Return the newest entry of the record of changes (str), or None when it is empty."""
        raise NotImplementedError

    #: True when fenced calls compare with copies of the version (a Cluster): a copy that a
    #: failover or a node restart lost is rewritten by ``write_version`` (see Limiter)
    versions_copied = False

    def delete(self, keys):
        """Delete ``keys`` and return how many existed."""
        raise NotImplementedError

    def claim(self, key, ttl_ms):
        """Set ``key`` for ``ttl_ms`` unless it exists; return True if this call set it."""
        raise NotImplementedError

    def scan(self, pattern):
        """Yield every key matching ``pattern`` (on every primary of a cluster)."""
        raise NotImplementedError

    def metrics_client(self):
        """Return the redis-py client the metrics flush and readers pipeline through."""
        raise NotImplementedError

    def close(self):
        """Close the connections this store opened itself (none by default: a django-redis
        client's pool belongs to django-redis, shared by the process)."""

    def ping(self):
        """Raise StoreUnavailable unless the store answers."""
        raise NotImplementedError

    def problems(self):
        """Return what stops this store from serving decisions (a list of sentences; empty when
        it can): unreachable, the wrong kind of Redis for this store, the script refused."""
        raise NotImplementedError


def settled_pairs(reply):
    """Return settle.lua's flat reply (level, charged, level, charged, ...) as a list of
    ``(level, charged)`` pairs, one per key."""
    return list(zip(reply[::2], reply[1::2]))
