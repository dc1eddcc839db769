"""Writing the usage counts for billing to Redis exactly once, however often a flush is sent.

A flush whose reply is lost (a connection cut after Redis ran it, a master killed after it
replicated the write, a timeout) has been applied as far as Redis knows and failed as far as the
worker knows. Sending it again is how nothing is lost, and redis-py itself re-sends a pipeline
on a connection error; a plain HINCRBY would then add the same usage two or more times. The
dashboard's counts accept that rare double count; a bill must not.

So a flush writes the usage as one numbered *batch*, with a script that adds it only if this
flusher's marker key says that number was not added yet, and sets the marker in the same atomic
step (one script: a replica receives both or neither). A batch keeps its number until a flush
carrying it is acknowledged: every re-send of it is a no-op once one has been applied. Each
flush numbers the usage counted since as a new batch and sends every batch in flight, in order,
so the first flush that succeeds after an outage writes everything; past MAX_IN_FLIGHT batches
(a minute of failed flushes), new usage waits unnumbered in ``unsent`` (bounded by the callers,
rules and days it holds, not by time). The script rides in the flush's own pipeline: no extra
round trip.

The marker is one key per flusher (per process), next to the pending hash in the ``{usage}``
slot. It must outlive any re-send: a flusher re-sends every interval until Redis answers, and
gives up on nothing, so the marker lives MARKER_TTL_S past the last batch.
"""

import os
import uuid
from collections import defaultdict

from . import fields
from .usage import USAGE_METRICS, usage_counts

__all__ = ["UsageBatches", "MARKER_TTL_S", "MAX_IN_FLIGHT"]

# A day: a marker must outlive the re-sends of its flusher's last batch (one a flush interval
# while Redis is unreachable); a process that ended leaves one small key for that long.
MARKER_TTL_S = 24 * 3600
MAX_IN_FLIGHT = 60

# KEYS: the pending hash, this flusher's marker. ARGV: the batch number, the pending hash's TTL,
# the marker's TTL, then field, count pairs. Returns 1 if added, 0 if added before.
_ADD_BATCH = """
local done = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) <= done then return 0 end
for i = 4, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[3])
return 1
"""


class UsageBatches:
    """One flusher's usage on its way to Redis: ``take`` moves it out of the pending minutes,
    ``queue`` adds the batches in flight to a flush's pipeline, ``acknowledged`` ends them."""

    def __init__(self):
        self._pid = None
        self._marker = ""
        self._number = 0
        self.in_flight = []               # [(number, {field: count})] sent, not acknowledged
        self.unsent = defaultdict(int)    # field -> count, waiting for the next batch

    def take(self, minutes):
        """Move the usage of the pending ``minutes`` (``{minute: PendingMinute}``) into
        ``unsent``: a flush that fails puts the minutes back without it."""
        self._own_process()
        for minute in minutes.values():
            for (day, ref, tenant, rule), record in usage_counts(minute.usage).items():
                for metric, value in zip(USAGE_METRICS, record):
                    if value:
                        self.unsent[fields.usage_field(day, ref, tenant, rule, record[3],
                                                       metric)] += value
            minute.usage.clear()

    def waiting(self):
        """Return whether any usage waits to be written."""
        return bool(self.in_flight or self.unsent)

    def queue(self, pipe, prefix, pending_ttl_s):
        """Number ``unsent`` as a new batch (within MAX_IN_FLIGHT) and queue every batch in
        flight on ``pipe``, oldest first. Returns how many were queued."""
        self._own_process()
        if self.unsent and len(self.in_flight) < MAX_IN_FLIGHT:
            self._number += 1
            self.in_flight.append((self._number, dict(self.unsent)))
            self.unsent = defaultdict(int)
        pending_key = fields.usage_pending_key(prefix)
        marker_key = fields.usage_marker_key(prefix, self._marker)
        for number, counts in self.in_flight:
            pairs = [part for field, count in counts.items() for part in (field, count)]
            # execute_command: a cluster pipeline has no eval(), yet routes EVAL by its keys
            pipe.execute_command("EVAL", _ADD_BATCH, 2, pending_key, marker_key, number,
                                 pending_ttl_s, MARKER_TTL_S, *pairs)
        return len(self.in_flight)

    def acknowledged(self):
        """The flush carrying the batches in flight was answered: they are added."""
        self.in_flight = []

    def clear(self):
        self.in_flight, self.unsent = [], defaultdict(int)

    def _own_process(self):
        # a forked child must not share its parent's marker: its batch 1 would be skipped as
        # the parent's; what it inherited in flight is its parent's to write
        if self._pid != os.getpid():
            if self._pid is not None:
                self.clear()
            self._pid, self._marker, self._number = os.getpid(), uuid.uuid4().hex, 0
