"""Writing a Recorder's counts to Redis, off the request path.

A daemon thread per process (started lazily by the first decision, again after a fork) calls
:meth:`Flusher.flush_now` every ``METRICS_FLUSH_INTERVAL_S``. ``flush_now`` takes the pending
minutes from the recorder and writes them in ONE pipelined round trip. Tests call ``flush_now``
themselves and inject clocks; nothing here needs a sleep to be tested.

While flushes fail (Redis down) nothing is lost: the pending minutes go back to the recorder
(which bounds them) and are written by the first flush that succeeds, which also records the
period for the dashboard. A flush whose reply is lost may have been applied: sent again, its
dashboard counts are added twice (a rare double count beats a silent loss), its usage for
billing once (usage_batches.py). A failed flush is the metrics' own health (``failing_since``,
``last_error``), never a failure of the circuit breaker that guards decisions: a metrics write
must not make requests fail open or closed. For the same reason the flush does not look at that
breaker; it tries once per interval, off the request path.

Any other exception (a bug, bad data, a library incompatibility) is handled the same way, kept
counts included, but reported as an unexpected error: counted apart from Redis errors and logged
with its traceback at a bounded rate (``process/unexpected.py``), not taken for Redis being down.
"""

import logging
import os
import time

from ..conf import get_config
from ..process.background import WorkerThread
from ..process.unexpected import UnexpectedErrorLog, error_text
from ..stores.base import READ_ERRORS
from . import fields
from .caller_history import CallerHistory
from .recorder import MAX_BUFFERED_MINUTES, NEAR_LIMIT_CAPACITY
from .usage_batches import UsageBatches

__all__ = ["Flusher"]

logger = logging.getLogger("ratelimit_app")

# A per-minute hot-key set is read only by the 5-minute and 1-hour windows.
HOT_MINUTE_TTL_S = 3600 + 300
NEAR_LIMIT_TTL_S = 15 * 60
# Buffered periods remembered in Redis for the dashboard.
BUFFERED_PERIODS_KEPT = 20
# Usage not rolled up into the database within this time is lost (roll up every minute or so).
USAGE_PENDING_TTL_S = 30 * 24 * 3600


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


def _queue_hot(pipe, prefix, hot, stored, targets):
    """Queue adding ``hot`` (member -> figures) to the hot-key sets of each
    ``(resolution, slot, ttl)`` in ``targets``, trimmed to the heaviest ``stored``."""
    if not hot:
        return
    for index, metric in enumerate(fields.HOT_METRICS):
        for resolution, slot, ttl in targets:
            key = fields.hot_key(prefix, metric, resolution, slot)
            for member, figures in hot.items():
                if figures[index]:
                    pipe.zincrby(key, figures[index], member)
            pipe.zremrangebyrank(key, 0, -stored - 1)  # ranks are ascending
            pipe.expire(key, ttl)


class Flusher:
    """Writes a Recorder's pending counts to Redis; ``flush_now`` is the only writer.

    ``client_provider()`` returns the redis-py client to write to (a Limiter passes its store's
    ``metrics_client``); every Redis call of the flush goes through it. ``request_errors()``
    returns how many Redis errors decisions met in this process (added to the all-time totals).
    ``unexpected(error, action)`` reports an exception other than a Redis error (a Limiter
    passes its ``unexpected_error``, which counts and logs it; by default it is only logged).
    ``clock`` returns unix seconds; ``config`` returns the RATELIMIT_APP settings dict.
    """

    def __init__(self, recorder, client_provider, clock=time.time, config=get_config,
                 request_errors=None, unexpected=None, before_flush=None):
        self.recorder = recorder
        # run before each flush: a Limiter reads the replies of its settles still unread,
        # whose counts would otherwise wait for the worker's next request
        self.before_flush = before_flush
        self.client_provider = client_provider
        self.request_errors = request_errors or (lambda: 0)
        self.unexpected = unexpected or UnexpectedErrorLog().report
        self.clock = clock
        self.config = config
        self.autostart = True      # whether Limiter.record may start the thread
        self.last_flush_at = None
        self.last_error = ""
        self.failing_since = None  # first failed flush of the current outage, unix time
        self.flushes = 0
        self._dropped_before = 0   # recorder.dropped when the outage began
        self._errors_flushed = 0   # request_errors() already added to the totals
        self.usage = UsageBatches()  # the usage taken from the recorder, not yet acknowledged
        self.history = CallerHistory()  # each key's and user's hours, from the same usage
        self._thread = WorkerThread(
            self._flush_in_thread, "ratelimit-metrics-flush",
            every_s=lambda: float(self.config()["METRICS_FLUSH_INTERVAL_S"]))

    def flush_now(self):
        """Write everything pending in one pipelined round trip. Returns the commands sent
        (0 when there was nothing to write or the write failed; then the counts stay buffered
        for the next flush). Never raises."""
        pending = {}
        try:
            if self.before_flush is not None:
                self.before_flush()
            client = self.client_provider()  # before taking: if it raises, nothing is lost
            pending = self.recorder.take_pending()
            self.history.take(pending)  # before the usage is taken out of the minutes
            self.usage.take(pending)
            if not pending and not self.usage.waiting():
                return 0
            now = self.clock()
            errors = self.request_errors()
            period = self._outage_period(pending, now)
            pipe = client.pipeline(transaction=False)
            self._queue(pipe, pending, now, errors - self._errors_flushed, period)
            self.usage.queue(pipe, self.config()["KEY_PREFIX"], USAGE_PENDING_TTL_S)
            self.history.queue(pipe, self.config()["KEY_PREFIX"])
            sent = len(pipe)
            pipe.execute()
        except READ_ERRORS as exc:
            # Kept for the next flush. If the connection broke half-way, the commands Redis
            # already applied are sent again: a rare double count beats a silent loss (the
            # usage batch, sent again, is added once).
            self._keep(pending, exc)
            return 0
        except Exception as exc:  # a bug or bad data: kept too, and reported loudly
            self._keep(pending, exc)
            self.unexpected(exc, "flushing metrics; the counts are kept for the next flush")
            return 0
        self.usage.acknowledged()
        self.history.acknowledged()
        self._errors_flushed = errors
        self.last_flush_at = now
        self.last_error = ""
        self.flushes += 1
        if period is not None:
            self.failing_since = None
            logger.warning("ratelimit_app: metrics flushed again; %d decisions buffered since "
                           "%.0f written", period["decisions"], period["from"])
        return sent

    def _outage_period(self, pending, now):
        """Return the buffered period the first flush after failed ones records for the
        dashboard of every worker, or None when the previous flush succeeded."""
        if self.failing_since is None:
            return None
        return {"from": self.failing_since, "to": now,
                "decisions": sum(minute.decisions() for minute in pending.values()),
                "dropped": self.recorder.dropped - self._dropped_before, "pid": os.getpid()}

    def _queue(self, pipe, pending, now, new_errors, period):
        """Queue the commands that write ``pending`` (and the flush's own facts) on ``pipe``."""
        config = self.config()
        prefix, retention = config["KEY_PREFIX"], int(config["METRICS_RETENTION_S"])
        stored = int(config["METRICS_HOT_KEYS_STORED"])
        totals_key = fields.totals_key(prefix)
        for minute, data in sorted(pending.items()):
            hour = minute // 60
            counts_keys = ((fields.counts_key(prefix, "minute", minute), retention),
                           (fields.counts_key(prefix, "hour", hour), retention + 3600))
            for (dimension, name, outcome), value in data.counts.items():
                field = fields.count_field(dimension, name, outcome)
                for key, _ in counts_keys:
                    pipe.hincrby(key, field, value)
                pipe.hincrby(totals_key, field, value)
            for key, ttl in counts_keys:
                pipe.expire(key, ttl)
            _queue_hot(pipe, prefix, _hot_members(data, stored), stored,
                       (("minute", minute, HOT_MINUTE_TTL_S), ("hour", hour, retention + 3600)))
            if data.near:
                near_key = fields.near_key(prefix, minute)
                pipe.zadd(near_key, {
                    fields.near_entry(member, rule, remaining, burst): at
                    for (member, rule), (remaining, burst, at) in data.near.items()})
                pipe.zremrangebyrank(near_key, 0, -NEAR_LIMIT_CAPACITY - 1)
                pipe.expire(near_key, NEAR_LIMIT_TTL_S)
        if new_errors > 0:
            pipe.hincrby(totals_key, fields.count_field("redis", "errors", "count"), new_errors)
        pipe.set(fields.flushed_at_key(prefix), repr(now), ex=retention)
        if period is not None:
            periods_key = fields.buffered_key(prefix)
            pipe.lpush(periods_key, fields.period_entry(period))
            pipe.ltrim(periods_key, 0, BUFFERED_PERIODS_KEPT - 1)
            pipe.expire(periods_key, retention)

    def _keep(self, pending, error):
        """Give ``pending`` back to the recorder after a failed flush, and note the failure."""
        self.recorder.restore(pending)
        self.last_error = f"{type(error).__name__}: {error_text(error)}"
        if self.failing_since is None:
            self.failing_since = self.clock()
            self._dropped_before = self.recorder.dropped
            if isinstance(error, READ_ERRORS):  # an unexpected error is logged by its reporter
                logger.warning("ratelimit_app: metrics flush failed (%s); buffering decisions "
                               "until Redis answers (at most %d minutes)", self.last_error,
                               MAX_BUFFERED_MINUTES)

    def reset(self, autostart=True):
        """Stop the thread, drop the recorder's pending counts and this flusher's failure state,
        and say whether ``Limiter.record`` may start the thread again."""
        self.stop()
        self.recorder.clear()
        self.usage.clear()
        self.history.clear()
        self.failing_since, self.last_error = None, ""
        self.autostart = autostart

    # -- the background thread --

    def ensure_running(self):
        """Start the background flush thread in this process if it is not running."""
        self._thread.ensure_running()

    def stop(self):
        """Stop the background thread (pending counts stay until the next flush_now)."""
        self._thread.stop()

    @property
    def running(self):
        return self._thread.running

    def _flush_in_thread(self):
        try:
            self.flush_now()
        except Exception as exc:  # flush_now reports its own; never let the thread die
            self.unexpected(exc, "running the metrics flush thread; it flushes again "
                                 "at the next tick")
