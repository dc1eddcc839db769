"""Decision metrics: counted in process on the request path, flushed to Redis off it, read back
for the dashboard and the Prometheus endpoint.

Request path: :func:`record_decision` only increments in-memory counters under a lock (a few
dict increments per policy of the decision, no Redis, no I/O).

Flush: a daemon thread per process (started lazily by the first decision, again after a fork)
calls :meth:`Flusher.flush_now` every ``METRICS_FLUSH_INTERVAL_S``. ``flush_now`` swaps the
pending counters out under the lock and writes them in ONE pipelined round trip. Tests call
``flush_now`` themselves and inject clocks; nothing here needs a sleep to be tested.

While flushes fail (Redis down, breaker open) nothing is lost: the pending minutes go back to
the recorder and are written by the first flush that succeeds, which also records the period
in ``<p>:m:buffered`` for the dashboard. The buffer is bounded (see ``MAX_BUFFERED_MINUTES``).

Hot keys: per minute, each process keeps two Space-Saving sketches (top identities by tokens
and by denials) of at most ``HOT_KEYS_CAPACITY`` entries each, so memory stays bounded however
many distinct identities an attacker uses. A flush adds the top ``HOT_KEYS_STORED`` of each to
per-minute and per-hour sorted sets in Redis, which are then trimmed to that many members.

Redis layout (every key from ``keys.metrics_key``: no hash tag, and no command touches two keys,
so it works unchanged on Redis Cluster where the buckets live)::

    <p>:m:c:<minute>                HASH "<dimension>|<name>|<outcome>" -> count  TTL retention
    <p>:m:ch:<hour>                 HASH the same per hour                        TTL retention + 1 h
    <p>:m:hot:<metric>:<minute>     ZSET identity -> tokens / denials / requests  TTL 1 h + 5 min
    <p>:m:hoth:<metric>:<hour>      ZSET the same per hour                        TTL retention + 1 h
    <p>:m:near:<minute>             ZSET near-limit sighting (JSON) -> unix time  TTL 15 min
    <p>:m:total                     HASH all-time counters (Prometheus)
    <p>:m:flushed_at                STRING unix time of the latest flush
    <p>:m:buffered                  LIST   JSON periods whose metrics were buffered    TTL retention
"""

import heapq
import json
import logging
import os
import threading
import time
from collections import defaultdict

from redis.exceptions import RedisError

from . import keys, storage
from .conf import get_config

__all__ = ["record_decision", "SpaceSaving", "Recorder", "Flusher",
           "recorder", "flusher", "reset", "identity_member", "parse_member", "WINDOWS",
           "read_series", "read_breakdown", "read_hot_keys", "read_near_limit",
           "read_last_flush_at", "read_totals", "read_buffered_periods"]

logger = logging.getLogger("ratelimit_app")

HOT_METRICS = ("tokens", "denials", "requests")
# A per-minute hot-key set is read only by the 5-minute and 1-hour windows.
HOT_MINUTE_TTL_S = 3600 + 300
NEAR_LIMIT_TTL_S = 15 * 60
# Near-limit sightings kept per process per minute, and per minute in Redis.
NEAR_LIMIT_CAPACITY = 200
# While flushes fail, pending minutes are kept, bounded: the newest MAX_DETAILED_MINUTES in
# full (both sketches, near-limit sightings), older ones compacted to what a flush writes
# anyway (counts, the top METRICS_HOT_KEYS_STORED identities of each sketch; near-limit
# sightings of old minutes are never shown, so they go). Beyond MAX_BUFFERED_MINUTES (an
# hour of outage) the oldest minute is dropped and counted in ``Recorder.dropped``.
MAX_DETAILED_MINUTES = 3
MAX_BUFFERED_MINUTES = 60
# Buffered periods remembered in Redis for the dashboard.
BUFFERED_PERIODS_KEPT = 20
# Window name -> (seconds, resolution) read by the dashboard.
WINDOWS = {"5m": (300, "minute"), "1h": (3600, "minute"), "24h": (86400, "hour")}
# Bucket keys of client scopes (the near-limit table is about clients, not shared buckets).
_CLIENT_TAGS = ("{user.", "{key.", "{ip.")


# --- identities -------------------------------------------------------------------------------

def identity_member(identity):
    """Return the hot-key member of an identity: ``"<ref>|<plan>|<display>"``.

    ``ref`` (``Identity.ref``) is enough for the inspector to find the caller again; ``display``
    is what staff see (never a secret).
    """
    return f"{identity.ref}|{identity.plan or ''}|{identity.display}"


def parse_member(member):
    """Return ``(ref, plan, display)`` of a hot-key member."""
    if isinstance(member, bytes):
        member = member.decode("utf-8", "replace")
    ref, plan, display = (member.split("|", 2) + ["", ""])[:3]
    return ref, plan, display


# --- the heavy-hitters sketch -----------------------------------------------------------------

class SpaceSaving:
    """Top identities by a weight in bounded memory (Metwally et al., weighted Space-Saving).

    At most ``capacity`` identities are tracked. An untracked identity with weight replaces the
    lightest one and inherits its weight (an over-estimate, kept as ``error``), which guarantees
    that every identity whose true weight exceeds total / capacity is tracked. Each entry also
    counts exact ``tokens``, ``denials`` and ``requests`` seen since it was tracked.
    Cost per update: O(1) for a tracked identity, O(log capacity) amortised otherwise.
    """

    def __init__(self, capacity):
        self.capacity = max(1, int(capacity))
        self.entries = {}  # member -> [weight, error, tokens, denials, requests]
        self._heap = []    # (weight when pushed, member); one per entry, possibly stale (lower)

    def __len__(self):
        return len(self.entries)

    def add(self, member, weight, tokens, denials):
        entry = self.entries.get(member)
        if entry is not None:
            entry[0] += weight
            entry[2] += tokens
            entry[3] += denials
            entry[4] += 1
            return
        if weight <= 0:
            return  # only weight earns a place in the sketch
        heap = self._heap
        if len(self.entries) < self.capacity:
            self.entries[member] = [weight, 0, tokens, denials, 1]
            heapq.heappush(heap, (weight, member))
            return
        # Weights only grow, so a heap entry may be stale (too low): refresh until the top is
        # exact; it is then the lightest entry.
        pushed, victim = self._lightest()
        del self.entries[victim]
        self.entries[member] = [pushed + weight, pushed, tokens, denials, 1]
        heapq.heapreplace(heap, (pushed + weight, member))

    def top(self, count):
        """Return the ``count`` heaviest ``(member, entry)`` pairs, heaviest first."""
        return heapq.nlargest(count, self.entries.items(), key=lambda item: item[1][0])

    def merge(self, other):
        """Add every entry of ``other`` (same rules as ``add``, all five figures summed)."""
        for member, (weight, error, tokens, denials, requests) in other.entries.items():
            entry = self.entries.get(member)
            if entry is not None:
                for index, value in enumerate((weight, error, tokens, denials, requests)):
                    entry[index] += value
                continue
            if len(self.entries) < self.capacity:
                self.entries[member] = [weight, error, tokens, denials, requests]
                heapq.heappush(self._heap, (weight, member))
                continue
            pushed, victim = self._lightest()
            del self.entries[victim]
            self.entries[member] = [pushed + weight, pushed + error, tokens, denials, requests]
            heapq.heapreplace(self._heap, (pushed + weight, member))

    def truncate(self, count):
        """Keep only the ``count`` heaviest entries (what a flush would write of them)."""
        if len(self.entries) <= count:
            return
        self.entries = {member: entry for member, entry in self.top(count)}
        self._heap = [(entry[0], member) for member, entry in self.entries.items()]
        heapq.heapify(self._heap)

    def _lightest(self):
        """Return ``(weight, member)`` of the lightest entry (refreshing stale heap tops)."""
        heap = self._heap
        while True:
            pushed, victim = heap[0]
            current = self.entries[victim][0]
            if current == pushed:
                return pushed, victim
            heapq.heapreplace(heap, (current, victim))


# --- in-process counting ----------------------------------------------------------------------

class _Minute:
    """Everything counted in one minute by this process, waiting for a flush."""

    __slots__ = ("counts", "by_tokens", "by_denials", "near", "started_at", "compacted")

    def __init__(self, capacity, started_at):
        self.counts = defaultdict(int)   # (dimension, name, outcome) -> count
        self.by_tokens = SpaceSaving(capacity)
        self.by_denials = SpaceSaving(capacity)
        self.near = {}                   # (member, rule) -> (remaining, burst, unix time)
        self.started_at = started_at     # when its first decision was counted
        self.compacted = False

    def merge(self, newer):
        """Add what ``newer`` (counted for the same minute since) holds to this minute."""
        for key, value in newer.counts.items():
            self.counts[key] += value
        self.by_tokens.merge(newer.by_tokens)
        self.by_denials.merge(newer.by_denials)
        if not self.compacted:
            for key, value in newer.near.items():
                Recorder._note_near(self.near, key, value)
        self.started_at = min(self.started_at, newer.started_at)

    def compact(self, stored):
        """Keep only what a flush writes of an old minute (see MAX_DETAILED_MINUTES)."""
        self.by_tokens.truncate(stored)
        self.by_denials.truncate(stored)
        self.near = {}
        self.compacted = True


def _decisions(pending):
    """Return how many decisions a pending minute counted."""
    return pending.counts.get(("all", "", "allowed"), 0) + pending.counts.get(("all", "", "denied"), 0)


class Recorder:
    """This process's pending counts, keyed by minute. ``clock`` returns unix seconds."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self._lock = threading.Lock()
        self._minutes = {}
        self.dropped = 0  # decisions lost to the MAX_BUFFERED_MINUTES bound

    def record(self, decision):
        """Count one decision (see the module docstring for what is counted)."""
        now = self.clock()
        minute = int(now // 60)
        allowed = decision.allowed
        outcome = "allowed" if allowed else "denied"
        identity = decision.identity
        plan = (identity.plan if identity is not None else None) or "-"
        endpoint = decision.endpoint or "-"
        policies = decision.policies
        with self._lock:
            pending = self._minutes.get(minute)
            if pending is None:
                pending = self._new_minute(minute, now)
            counts = pending.counts
            counts["all", "", outcome] += 1
            counts["plan", plan, outcome] += 1
            counts["endpoint", endpoint, outcome] += 1
            if decision.shadow_violations:
                counts["all", "", "shadow"] += 1
                counts["plan", plan, "shadow"] += 1
                counts["endpoint", endpoint, "shadow"] += 1
                for name in decision.shadow_violations:
                    counts["rule", name, "shadow"] += 1
            for status in policies:
                counts["rule", status.name, "checked"] += 1
            for name in decision.violated:
                counts["rule", name, "denied"] += 1
            if decision.degraded:
                counts["degraded", decision.degraded, "count"] += 1
            if identity is None:
                return
            member = identity_member(identity)
            tokens = decision.cost if allowed and policies else 0
            denials = 0 if allowed else 1
            pending.by_tokens.add(member, tokens, tokens, denials)
            pending.by_denials.add(member, denials, tokens, denials)
            for status in policies:
                # remaining under 20 % of the burst (integers: no division on the hot path)
                if status.remaining * 5 < status.burst and not status.shadow \
                        and any(tag in status.key for tag in _CLIENT_TAGS):
                    self._note_near(pending.near, (member, status.name),
                                    (status.remaining, status.burst, now))

    @staticmethod
    def _note_near(near, key, value):
        if key in near:
            del near[key]  # re-insert: dict order is recency order
        elif len(near) >= NEAR_LIMIT_CAPACITY:
            del near[next(iter(near))]  # forget the oldest sighting
        near[key] = value

    def _new_minute(self, minute, now):
        pending = self._minutes[minute] = _Minute(get_config()["HOT_KEYS_CAPACITY"], now)
        self._bound()
        return pending

    def _bound(self):
        """Hold the buffer to its bounds (caller holds the lock); see MAX_BUFFERED_MINUTES."""
        minutes = sorted(self._minutes)
        while len(minutes) > MAX_BUFFERED_MINUTES:
            lost = _decisions(self._minutes.pop(minutes.pop(0)))
            self.dropped += lost
            logger.warning("ratelimit_app: metrics buffered for more than %d minutes; %d "
                           "decisions of the oldest minute not counted", MAX_BUFFERED_MINUTES,
                           lost)
        stored = int(get_config()["METRICS_HOT_KEYS_STORED"])
        for minute in minutes[:-MAX_DETAILED_MINUTES]:
            if not self._minutes[minute].compacted:
                self._minutes[minute].compact(stored)

    def take_pending(self):
        """Return ``{minute: pending}`` and start counting afresh (used by the flusher)."""
        with self._lock:
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
        with self._lock:
            pending = list(self._minutes.values())
        return (sum(_decisions(p) for p in pending),
                min((p.started_at for p in pending), default=None))

    def clear(self):
        with self._lock:
            self._minutes = {}
            self.dropped = 0

    def counts(self):
        """Return ``{(dimension, name, outcome): count}`` summed over the pending minutes."""
        total = defaultdict(int)
        with self._lock:
            for pending in self._minutes.values():
                for key, value in pending.counts.items():
                    total[key] += value
        return dict(total)

    def sketch_sizes(self):
        """Return the number of identities held in memory (all pending minutes, both sketches)."""
        with self._lock:
            return sum(len(p.by_tokens) + len(p.by_denials) for p in self._minutes.values())


# --- flushing ---------------------------------------------------------------------------------

def _prefix():
    return get_config()["KEY_PREFIX"]


def _hot_members(pending, stored):
    """Merge both sketches' top entries: member -> (tokens, denials, requests)."""
    merged = {}
    for sketch in (pending.by_tokens, pending.by_denials):
        for member, entry in sketch.top(stored):
            seen = merged.get(member, (0, 0, 0))
            # the sketch that tracked the member longer saw more: take the larger counts
            merged[member] = (max(seen[0], entry[2]), max(seen[1], entry[3]),
                              max(seen[2], entry[4]))
    return merged


class Flusher:
    """Writes a Recorder's pending counts to Redis; ``flush_now`` is the only writer."""

    def __init__(self, recorder, clock=time.time):
        self.recorder = recorder
        self.clock = clock
        self.last_flush_at = None
        self.last_error = ""
        self.failing_since = None  # first failed flush of the current outage, unix time
        self._dropped_before = 0   # recorder.dropped when the outage began
        self.flushes = 0
        self._thread = None
        self._pid = None
        self._stop = threading.Event()
        self._redis_errors_flushed = 0

    def flush_now(self):
        """Write everything pending in one pipelined round trip. Returns the commands sent
        (0 when there was nothing to write or Redis is known to be down; then the counts stay
        buffered for the next flush)."""
        pending = self.recorder.take_pending()
        if not pending:
            return 0
        if storage.breaker().state == storage.breaker().OPEN:
            self._keep(pending, "circuit breaker open")
            return 0
        config = get_config()
        prefix, retention = config["KEY_PREFIX"], int(config["METRICS_RETENTION_S"])
        stored = int(config["METRICS_HOT_KEYS_STORED"])
        now = self.clock()
        pipe = storage.get_client().pipeline(transaction=False)
        for minute, data in sorted(pending.items()):
            hour = minute // 60
            series = (keys.metrics_key(prefix, "c", minute), retention)
            hourly = (keys.metrics_key(prefix, "ch", hour), retention + 3600)
            total_key = keys.metrics_key(prefix, "total")
            for (dimension, name, outcome), value in data.counts.items():
                field = f"{dimension}|{name}|{outcome}"
                for key, _ in (series, hourly):
                    pipe.hincrby(key, field, value)
                pipe.hincrby(total_key, field, value)
            for key, ttl in (series, hourly):
                pipe.expire(key, ttl)
            hot = _hot_members(data, stored)
            if hot:
                for index, metric in enumerate(HOT_METRICS):
                    targets = ((keys.metrics_key(prefix, "hot", metric, minute), HOT_MINUTE_TTL_S),
                               (keys.metrics_key(prefix, "hoth", metric, hour), retention + 3600))
                    for key, ttl in targets:
                        for member, values in hot.items():
                            if values[index]:
                                pipe.zincrby(key, values[index], member)
                        # keep the heaviest `stored` members (ranks are ascending)
                        pipe.zremrangebyrank(key, 0, -stored - 1)
                        pipe.expire(key, ttl)
            if data.near:
                near_key = keys.metrics_key(prefix, "near", minute)
                pipe.zadd(near_key, {
                    json.dumps([member, rule, remaining, burst]): at
                    for (member, rule), (remaining, burst, at) in data.near.items()})
                pipe.zremrangebyrank(near_key, 0, -NEAR_LIMIT_CAPACITY - 1)
                pipe.expire(near_key, NEAR_LIMIT_TTL_S)
        errors = storage.stats.redis_errors
        if errors > self._redis_errors_flushed:
            pipe.hincrby(keys.metrics_key(prefix, "total"), "redis|errors|count",
                         errors - self._redis_errors_flushed)
        pipe.set(keys.metrics_key(prefix, "flushed_at"), repr(now), ex=retention)
        decisions = sum(_decisions(p) for p in pending.values())
        period = None
        if self.failing_since is not None:
            # the first flush after an outage says so, for the dashboard of every worker
            period = {"from": self.failing_since, "to": now, "decisions": decisions,
                      "dropped": self.recorder.dropped - self._dropped_before,
                      "pid": os.getpid()}
            periods_key = keys.metrics_key(prefix, "buffered")
            pipe.lpush(periods_key, json.dumps(period))
            pipe.ltrim(periods_key, 0, BUFFERED_PERIODS_KEPT - 1)
            pipe.expire(periods_key, retention)
        sent = len(pipe)
        try:
            pipe.execute()
        except RedisError as exc:
            # Kept for the next flush. If the connection broke half-way, the commands Redis
            # already applied are sent again: a rare double count beats a silent loss.
            self._keep(pending, f"{type(exc).__name__}: {exc}")
            return 0
        self._redis_errors_flushed = errors
        self.last_flush_at = now
        self.last_error = ""
        self.flushes += 1
        if period is not None:
            self.failing_since = None
            logger.warning("ratelimit_app: metrics flushed again; %d decisions buffered since "
                           "%.0f written", decisions, period["from"])
        return sent

    def _keep(self, pending, reason):
        self.recorder.restore(pending)
        self.last_error = reason
        if self.failing_since is None:
            self.failing_since = self.clock()
            self._dropped_before = self.recorder.dropped
            logger.warning("ratelimit_app: metrics flush failed (%s); buffering decisions "
                           "until Redis answers (at most %d minutes)", reason,
                           MAX_BUFFERED_MINUTES)

    # -- the background thread --

    def ensure_running(self):
        """Start the background flush thread in this process if it is not running."""
        pid = os.getpid()
        if self._pid == pid and self._thread is not None and self._thread.is_alive():
            return
        with self.recorder._lock:  # two first requests at once start one thread
            if self._pid == pid and self._thread is not None and self._thread.is_alive():
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, args=(self._stop,),
                                            name="ratelimit-metrics-flush", daemon=True)
            self._pid = pid
            self._thread.start()

    def stop(self):
        """Stop the background thread (pending counts stay until the next flush_now)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    @property
    def running(self):
        return self._thread is not None and self._thread.is_alive()

    def _run(self, stop):
        while not stop.wait(float(get_config()["METRICS_FLUSH_INTERVAL_S"])):
            try:
                self.flush_now()
            except Exception:  # never let the thread die: the next tick tries again
                logger.exception("ratelimit_app: metrics flush crashed")


recorder = Recorder()
flusher = Flusher(recorder)
_background = {"enabled": True}


def record_decision(decision):
    """Count one decision in this process (the request path's only metrics call; no Redis)."""
    if not get_config()["METRICS_ENABLED"]:
        return
    recorder.record(decision)
    if _background["enabled"] and not flusher.running:
        flusher.ensure_running()


def reset(background=True):
    """Drop pending counts, stop the flush thread, and say whether decisions may start it again.

    The test suite calls ``reset(background=False)`` so that no thread writes to Redis behind a
    test's back; tests flush with ``flusher.flush_now()``.
    """
    flusher.stop()
    recorder.clear()
    flusher.failing_since, flusher.last_error = None, ""
    _background["enabled"] = background


# --- reads for the dashboard and Prometheus ---------------------------------------------------

def _decode(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _window_slots(window, now):
    """Return the time slots of a window, oldest first: ``(resolution, [slot, ...])``."""
    seconds, resolution = WINDOWS[window]
    if resolution == "minute":
        last = int(now // 60)
        return resolution, list(range(last - seconds // 60 + 1, last + 1))
    last = int(now // 3600)
    return resolution, list(range(last - seconds // 3600 + 1, last + 1))


def read_series(minutes=60, now=None):
    """Return ``[{"minute": unix start, "allowed", "denied", "shadow"}]`` for the last
    ``minutes`` minutes, oldest first (missing minutes are zeros)."""
    now = time.time() if now is None else now
    last = int(now // 60)
    slots = list(range(last - minutes + 1, last + 1))
    client = storage.get_client()
    pipe = client.pipeline(transaction=False)
    for minute in slots:
        pipe.hmget(keys.metrics_key(_prefix(), "c", minute),
                   ["all||allowed", "all||denied", "all||shadow"])
    rows = []
    for minute, values in zip(slots, pipe.execute()):
        allowed, denied, shadow = (int(v or 0) for v in values)
        rows.append({"minute": minute * 60, "allowed": allowed, "denied": denied,
                     "shadow": shadow})
    return rows


def read_breakdown(window="1h", now=None):
    """Return counts over a window: ``{"all": {...}, "plan": {name: {...}}, "endpoint": ...,
    "rule": ..., "degraded": ...}`` where each ``{...}`` maps an outcome (allowed, denied, shadow,
    checked, count) to a number."""
    now = time.time() if now is None else now
    resolution, slots = _window_slots(window, now)
    name = "c" if resolution == "minute" else "ch"
    pipe = storage.get_client().pipeline(transaction=False)
    for slot in slots:
        pipe.hgetall(keys.metrics_key(_prefix(), name, slot))
    result = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    for fields in pipe.execute():
        for field, value in fields.items():
            dimension, item, outcome = (_decode(field).split("|") + ["", ""])[:3]
            result[dimension][item][outcome] += int(value)
    return {dimension: {item: dict(outcomes) for item, outcomes in items.items()}
            for dimension, items in result.items()}


def read_hot_keys(window="1h", limit=10, now=None):
    """Return ``{"tokens": rows, "denials": rows}``: the top ``limit`` identities of a window by
    tokens used and by denials. A row is ``{"member", "ref", "plan", "display", "tokens",
    "denials", "requests"}``; a figure beside the ranked one is 0 if it fell out of its set."""
    now = time.time() if now is None else now
    resolution, slots = _window_slots(window, now)
    name = "hot" if resolution == "minute" else "hoth"
    pipe = storage.get_client().pipeline(transaction=False)
    for metric in HOT_METRICS:
        for slot in slots:
            pipe.zrange(keys.metrics_key(_prefix(), name, metric, slot), 0, -1, withscores=True)
    replies = iter(pipe.execute())
    totals = {metric: defaultdict(float) for metric in HOT_METRICS}
    for metric in HOT_METRICS:
        for _ in slots:
            for member, score in next(replies):
                totals[metric][_decode(member)] += score
    tables = {}
    for metric in ("tokens", "denials"):
        ranked = sorted(totals[metric].items(), key=lambda item: (-item[1], item[0]))[:limit]
        rows = []
        for member, _score in ranked:
            ref, plan, display = parse_member(member)
            rows.append({"member": member, "ref": ref, "plan": plan, "display": display,
                         **{m: int(totals[m].get(member, 0)) for m in HOT_METRICS}})
        tables[metric] = rows
    return tables


def read_near_limit(minutes=5, limit=20, now=None):
    """Return the latest near-limit sightings of the last ``minutes`` minutes, newest first:
    ``[{"member", "ref", "plan", "display", "rule", "remaining", "burst", "at"}]``, one per
    identity and rule."""
    now = time.time() if now is None else now
    last = int(now // 60)
    pipe = storage.get_client().pipeline(transaction=False)
    for minute in range(last - minutes + 1, last + 1):
        pipe.zrange(keys.metrics_key(_prefix(), "near", minute), 0, -1, withscores=True)
    latest = {}
    for reply in pipe.execute():
        for raw, at in reply:
            try:
                member, rule, remaining, burst = json.loads(raw)
            except (ValueError, TypeError):
                continue
            if (member, rule) not in latest or latest[member, rule]["at"] < at:
                ref, plan, display = parse_member(member)
                latest[member, rule] = {"member": member, "ref": ref, "plan": plan,
                                        "display": display, "rule": rule,
                                        "remaining": remaining, "burst": burst, "at": at}
    return sorted(latest.values(), key=lambda row: -row["at"])[:limit]


def read_last_flush_at():
    """Return the unix time of the latest flush by any process, or None."""
    value = storage.get_client().get(keys.metrics_key(_prefix(), "flushed_at"))
    return float(value) if value else None


def read_buffered_periods():
    """Return the latest periods whose metrics were buffered while Redis was unreachable,
    newest first: ``[{"from", "to", "decisions", "dropped", "pid"}]`` (unix times)."""
    periods = []
    for raw in storage.get_client().lrange(keys.metrics_key(_prefix(), "buffered"), 0, -1):
        try:
            period = json.loads(raw)
            periods.append({name: period[name] for name in
                            ("from", "to", "decisions", "dropped", "pid")})
        except (ValueError, TypeError, KeyError):
            continue
    return periods


def read_totals():
    """Return the all-time counters: ``{(dimension, name, outcome): count}``."""
    raw = storage.get_client().hgetall(keys.metrics_key(_prefix(), "total"))
    totals = {}
    for field, value in raw.items():
        parts = (_decode(field).split("|") + ["", ""])[:3]
        totals[tuple(parts)] = int(value)
    return totals
