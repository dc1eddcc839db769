"""Counting decisions in process, on the request path: an append to a queue per decision (no
Redis, no I/O, no lock), counted per minute in batches until a flush takes them.

Usage records (billing): per minute, the decisions that charged buckets, by shape with their
caller and calendar day (see views/usage.py); never compacted, never sampled.

Hot keys: per minute, two Space-Saving sketches (top identities by tokens and by denials) of at
most ``HOT_KEYS_CAPACITY`` entries each, so memory stays bounded however many distinct
identities an attacker uses.

While flushes fail, pending minutes are kept, bounded: the newest ``MAX_DETAILED_MINUTES`` in
full (both sketches, near-limit sightings), older ones compacted to what a flush writes anyway
(counts, the top ``METRICS_HOT_KEYS_STORED`` identities of each sketch; near-limit sightings of
old minutes are never shown, so they go). Beyond ``MAX_BUFFERED_MINUTES`` (an hour of outage)
the oldest minute is dropped and counted in ``Recorder.dropped``.
"""

import contextlib
import logging
import operator
import threading
import time
from collections import defaultdict, deque

from ..conf import get_config
from ..decision.buckets import LevelStatuses
from .fields import identity_member
from .sketch import SpaceSaving
from .usage import DayClock, cost_of, usage_caller

__all__ = ["Recorder", "PendingMinute", "WAIT_BATCH", "COUNT_BATCH", "NEAR_LIMIT_CAPACITY",
           "MAX_DETAILED_MINUTES", "MAX_BUFFERED_MINUTES"]

logger = logging.getLogger("ratelimit_app")

# Near-limit sightings kept per process per minute, and per minute in Redis.
NEAR_LIMIT_CAPACITY = 200
# Decisions are queued as they are made and counted in batches, in one loop (warm caches:
# counted one by one, between requests, each costs a few µs more). A batch of WAIT_BATCH is
# counted while a decision waits for Redis's reply (``count_queued_now``: the process would only
# wait then; on one host a round trip is tens of µs, about what 16 decisions take to count; on
# an event loop, once a turn's commands are written, so no request stalls the loop for long). A
# batch of COUNT_BATCH is counted by the request that fills it when no wait came first (an
# async store on redis.asyncio, which offers no such gap; a threaded server whose other thread
# holds the lock; it spends about a millisecond), and whoever reads the counts (the flush
# thread each second, the dashboard) counts what is queued.
WAIT_BATCH = 16
COUNT_BATCH = 256
MAX_DETAILED_MINUTES = 3
MAX_BUFFERED_MINUTES = 60
# Bucket keys of client scopes (the near-limit table is about clients, not shared buckets).
_CLIENT_TAGS = ("{user.", "{key.", "{ip.")


def _note_near(near, key, value):
    """Remember a near-limit sighting; ``near`` keeps the latest NEAR_LIMIT_CAPACITY."""
    if key in near:
        del near[key]  # re-insert: dict order is recency order
    elif len(near) >= NEAR_LIMIT_CAPACITY:
        del near[next(iter(near))]  # forget the oldest sighting
    near[key] = value


def _count_keys(allowed, plan, endpoint, names, violated, shadow_violations, degraded):
    """Return the count keys one decision of this shape adds 1 to."""
    outcome = "allowed" if allowed else "denied"
    keys = [("all", "", outcome), ("plan", plan, outcome), ("endpoint", endpoint, outcome)]
    if shadow_violations:
        keys += [("all", "", "shadow"), ("plan", plan, "shadow"),
                 ("endpoint", endpoint, "shadow")]
        keys += [("rule", name, "shadow") for name in shadow_violations]
    keys += [("rule", name, "checked") for name in names]
    keys += [("rule", name, "denied") for name in violated]
    if degraded:
        keys.append(("degraded", degraded, "count"))
    return keys


_name = operator.attrgetter("name")  # a PolicyStatus's; in C, for map()


def _is_client_key(key):
    """True if bucket key ``key`` is a client's (a user's, a key's, an address's)."""
    return any(tag in key for tag in _CLIENT_TAGS)


def _metric_parts(planned):
    """Return ``(rule names, costs, near-limit candidates)`` of an allowed decision on
    ``planned`` (PlannedBuckets) read from its levels (see LevelStatuses), kept on it: what
    ``Recorder._count`` would read from its statuses. A candidate is ``(position, rule name,
    burst, period_ms)`` of an enforced client bucket."""
    parts = planned.metric_parts
    if parts is None:
        parts = planned.metric_parts = (
            tuple(bucket.rule.name for bucket in planned),
            tuple(bucket.cost for bucket in planned),
            tuple((index, bucket.rule.name, bucket.rule.burst, bucket.period_ms)
                  for index, bucket in enumerate(planned)
                  if not bucket.rule.shadow and _is_client_key(bucket.key)))
    return parts


# Identities whose metrics fields a Recorder remembers (see Recorder._member).
MAX_MEMBERS_MEMOISED = 4096


class PendingMinute:
    """Everything counted in one minute by this process, waiting for a flush."""

    __slots__ = ("_counts", "shapes", "usage", "by_tokens", "by_denials", "near", "started_at",
                 "compacted")

    def __init__(self, capacity, started_at):
        self._counts = defaultdict(int)  # (dimension, name, outcome) -> count
        # decisions not yet added to the counts, by shape (see Recorder.record): one increment
        # per decision instead of one per count it adds to
        self.shapes = defaultdict(int)
        # (day, caller, allowed, rule names, per-rule costs | refusing rules) -> decisions
        # (see usage.py)
        self.usage = defaultdict(int)
        self.by_tokens = SpaceSaving(capacity)
        self.by_denials = SpaceSaving(capacity)
        self.near = {}                   # (member, rule) -> (remaining, burst, unix time)
        self.started_at = started_at     # when its first decision was counted
        self.compacted = False

    @property
    def counts(self):
        """``{(dimension, name, outcome): count}`` of this minute (exact: the shapes counted so
        far are added first). Read under the recorder's lock, or once the minute is taken."""
        if self.shapes:
            counts = self._counts
            for shape, times in self.shapes.items():
                for key in _count_keys(*shape):
                    counts[key] += times
            self.shapes = defaultdict(int)
        return self._counts

    def decisions(self):
        """Return how many decisions this minute counted."""
        counts = self.counts
        return counts.get(("all", "", "allowed"), 0) + counts.get(("all", "", "denied"), 0)

    def merge(self, newer):
        """Add what ``newer`` (counted for the same minute since) holds to this minute."""
        counts = self.counts
        for key, value in newer.counts.items():
            counts[key] += value
        for shape, decisions in newer.usage.items():
            self.usage[shape] += decisions
        self.by_tokens.merge(newer.by_tokens)
        self.by_denials.merge(newer.by_denials)
        if not self.compacted:
            for key, value in newer.near.items():
                _note_near(self.near, key, value)
        self.started_at = min(self.started_at, newer.started_at)

    def compact(self, stored):
        """Keep only what a flush writes of an old minute (see MAX_DETAILED_MINUTES; the usage
        is written whole)."""
        self.by_tokens.truncate(stored)
        self.by_denials.truncate(stored)
        self.near = {}
        self.compacted = True


class Recorder:
    """This process's pending counts, keyed by minute.

    ``clock`` returns unix seconds; ``config`` returns the RATELIMIT_APP settings dict.
    """

    def __init__(self, clock=time.time, config=get_config):
        self.clock = clock
        self.config = config
        self._days = DayClock(lambda: self.config()["CALENDAR_TIME_ZONE"])
        self._lock = threading.Lock()
        self._minutes = {}
        # (clock reading, Decision) not counted yet: appended without the lock (deque.append
        # and popleft are atomic), counted under it (see COUNT_BATCH)
        self._queue = deque()
        self.dropped = 0  # decisions lost to the MAX_BUFFERED_MINUTES bound
        self._members = {}  # Identity -> its metrics fields (see _member)

    def record(self, decision):
        """Queue one decision for counting (see COUNT_BATCH). Returns True when it is the first
        one queued since the queue was last counted: the caller's cue to check that the flush
        thread runs (once per batch or flush, not per decision)."""
        queue = self._queue
        queue.append((self.clock(), decision))
        queued = len(queue)
        if queued >= COUNT_BATCH:
            with self._lock:
                self._count_queued()
        return queued == 1

    def queued(self):
        """Return how many decisions are queued and not counted yet."""
        return len(self._queue)

    def count_queued_now(self):
        """Count the decisions queued if they make a WAIT_BATCH, unless another thread is
        counting. The store calls this while a decision's reply is on its way (the process only
        waits then), so counting usually costs requests nothing."""
        if len(self._queue) >= WAIT_BATCH and self._lock.acquire(blocking=False):
            try:
                self._count_queued()
            finally:
                self._lock.release()

    @contextlib.contextmanager
    def _counted(self):
        """Hold the lock with every queued decision counted: how the counts are read."""
        with self._lock:
            self._count_queued()
            yield

    def _count_queued(self):
        """Count every queued decision (caller holds the lock)."""
        queue, count = self._queue, self._count
        while queue:  # only the lock holder takes from the queue: it cannot empty meanwhile
            now, decision = queue.popleft()
            count(now, decision)

    def _count(self, now, decision):
        """Count one decision made at ``now``: by outcome for all, its plan, its endpoint and
        each rule; its identity in the hot-key sketches and its usage; its client buckets under
        20 % as near-limit (caller holds the lock)."""
        minute = int(now // 60)
        allowed = decision.allowed
        identity = decision.identity
        policies = decision.policies
        if type(policies) is LevelStatuses:
            # (most decisions) names, costs and near-limit candidates from its PlannedBuckets,
            # levels from the reply: no status is built
            names, costs, near_candidates = _metric_parts(policies.planned)
        else:
            names, costs, near_candidates = tuple(map(_name, policies)), None, None
        # Everything the counts need, as one key (see _count_keys): names of rules, plans and
        # endpoints come from the configuration, so there are few shapes; PendingMinute.counts
        # adds them up when read (off the request path: the flush thread, the dashboard).
        shape = (allowed, (identity.plan if identity is not None else None) or "-",
                 decision.endpoint or "-", names, decision.violated,
                 decision.shadow_violations, decision.degraded)
        pending = self._minutes.get(minute)
        if pending is None:
            pending = self._new_minute(minute, now)
        pending.shapes[shape] += 1
        if identity is None:
            return
        member, caller = self._member(identity)
        if policies:  # it charged buckets (or was refused by them): usage for billing, per
            # caller (anonymous ones together: no key per IP address) and what each bucket
            # charged; a refusal charged nothing, and holds the rules that refused it instead
            # (the caller's page counts refusals by rule, metrics/caller_history.py)
            if allowed and costs is None:
                costs = tuple(map(cost_of, policies))
            pending.usage[(self._days.day_of(now), caller, allowed, names,
                           costs if allowed else decision.violated)] += 1
        tokens = decision.cost if allowed and policies else 0
        denials = 0 if allowed else 1
        pending.by_tokens.add(member, tokens, tokens, denials)
        pending.by_denials.add(member, denials, tokens, denials)
        # remaining under 20 % of the burst (integers: no division on the hot path)
        if near_candidates is not None:
            levels = policies.levels
            for index, name, burst, period_ms in near_candidates:
                remaining = levels[index] // period_ms
                if remaining * 5 < burst:
                    _note_near(pending.near, (member, name), (remaining, burst, now))
            return
        for status in policies:
            if status.remaining * 5 < status.burst and not status.shadow \
                    and _is_client_key(status.key):
                _note_near(pending.near, (member, status.name),
                           (status.remaining, status.burst, now))

    def _member(self, identity):
        """Return ``(identity_member(identity), usage_caller(identity))``, memoised: the same
        callers come back decision after decision (about 0.3 µs each). An Identity's fields
        are length-bounded (decision/identity.py), and the memo starts afresh when full, so it is
        bounded in bytes too (caller holds the lock)."""
        members = self._members
        member = members.get(identity)
        if member is None:
            if len(members) >= MAX_MEMBERS_MEMOISED:
                members.clear()
            member = members[identity] = (identity_member(identity), usage_caller(identity))
        return member

    def _new_minute(self, minute, now):
        pending = self._minutes[minute] = PendingMinute(self.config()["HOT_KEYS_CAPACITY"], now)
        self._bound()
        return pending

    def _bound(self):
        """Hold the buffer to its bounds (caller holds the lock); see MAX_BUFFERED_MINUTES."""
        minutes = sorted(self._minutes)
        while len(minutes) > MAX_BUFFERED_MINUTES:
            lost = self._minutes.pop(minutes.pop(0)).decisions()
            self.dropped += lost
            logger.warning("ratelimit_app: metrics buffered for more than %d minutes; %d "
                           "decisions of the oldest minute not counted", MAX_BUFFERED_MINUTES,
                           lost)
        stored = int(self.config()["METRICS_HOT_KEYS_STORED"])
        for minute in minutes[:-MAX_DETAILED_MINUTES]:
            if not self._minutes[minute].compacted:
                self._minutes[minute].compact(stored)

    def take_pending(self):
        """Return ``{minute: PendingMinute}`` and start counting afresh (used by the flusher)."""
        with self._counted():
            taken, self._minutes = self._minutes, {}
        return taken

    def restore(self, taken):
        """Put back minutes a flush could not write, merged with what was counted since."""
        with self._lock:
            for minute, older in taken.items():
                newer = self._minutes.get(minute)
                if newer is not None:
                    older.merge(newer)
                self._minutes[minute] = older
            self._bound()

    def pending_decisions(self):
        """Return ``(decisions waiting for a flush, when the oldest of them was counted)``."""
        with self._counted():  # decisions() adds up the shapes, which counting adds to
            pending = list(self._minutes.values())
            decisions = sum(p.decisions() for p in pending)
        return decisions, min((p.started_at for p in pending), default=None)

    def clear(self):
        with self._lock:
            self._queue.clear()
            self._minutes = {}
            self.dropped = 0

    def counts(self):
        """Return ``{(dimension, name, outcome): count}`` summed over the pending minutes."""
        total = defaultdict(int)
        with self._counted():
            for pending in self._minutes.values():
                for key, value in pending.counts.items():
                    total[key] += value
        return dict(total)

    def sketch_sizes(self):
        """Return the number of identities held in memory (all pending minutes, both sketches)."""
        with self._counted():
            return sum(len(p.by_tokens) + len(p.by_denials) for p in self._minutes.values())
