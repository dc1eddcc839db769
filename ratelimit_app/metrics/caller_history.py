"""Each caller's last day, hour by hour: what the caller's page charts and paces its quotas by.

Written by the flush, from the usage shapes the Recorder already counts for billing (usage.py):
nothing more happens on the request path. A refused decision's shape carries the names of the
rules that refused it (``Decision.violated``) where an allowed one carries its costs, so the
refusals are kept by rule too.

Only API keys and signed-in users get a history. Anonymous callers are counted together for
billing (``usage.ANONYMOUS``) and get none here: a history per client address would let one
client grow Redis by rotating addresses. Their page shows what the hot-key sketch has instead.

Layout (``fields.caller_hour_key``)::

    <p>:m:who:<ref>:<hour>   HASH  "allowed" | "refused" | "units|<rule>" | "refused|<rule>"
                                   -> count                                        TTL ~25 h

One key per caller and hour, so a caller's day is 24 HGETALLs in one pipeline. A flush whose
reply is lost is sent again: as with the dashboard's counts, a rare double count beats a loss.
"""

from collections import defaultdict

from . import fields
from .usage import ANONYMOUS

__all__ = ["CallerHistory", "HISTORY_HOURS", "HISTORY_TTL_S", "hourly_counts", "read_history"]

HISTORY_HOURS = 24
# the current hour and the 24 before it are read; an hour's key lives a little longer
HISTORY_TTL_S = (HISTORY_HOURS + 1) * 3600 + 300


def hourly_counts(minutes):
    """Return ``{(ref, hour): {field: count}}`` of the usage shapes of the pending ``minutes``
    (``{minute: PendingMinute}``), for the callers that get a history (keys and users)."""
    counts = defaultdict(lambda: defaultdict(int))
    for minute, pending in minutes.items():
        hour = minute // 60
        for (_day, (ref, _tenant, _display), allowed, names, costs), decisions in \
                pending.usage.items():
            if ref == ANONYMOUS:
                continue
            fields_of = counts[(ref, hour)]
            if allowed:
                fields_of[fields.HISTORY_ALLOWED] += decisions
                for name, cost in zip(names, costs):
                    fields_of[fields.history_units_field(name)] += cost * decisions
            else:
                fields_of[fields.HISTORY_REFUSED] += decisions
                # a refusal's shape holds the rules that refused it (older shapes: none)
                for name in costs:
                    fields_of[fields.history_refused_field(name)] += decisions
    return counts


class CallerHistory:
    """One flusher's caller history on its way to Redis: ``take`` before the usage is taken
    from the minutes, ``queue`` into the flush's pipeline, ``acknowledged`` once it answered.
    While flushes fail it is kept, only for the hours a page still reads (bounded by the
    callers with traffic, which are rows of the database, times 25 hours)."""

    def __init__(self):
        self.unsent = defaultdict(lambda: defaultdict(int))

    def take(self, minutes):
        for slot, counts in hourly_counts(minutes).items():
            kept = self.unsent[slot]
            for field, value in counts.items():
                kept[field] += value

    def queue(self, pipe, prefix):
        """Queue the history on ``pipe``; hours a page no longer reads (a day older than the
        latest one held: kept through a long outage) are dropped. Returns how many
        caller-hours were queued."""
        if self.unsent:
            oldest = max(hour for _ref, hour in self.unsent) - HISTORY_HOURS
            for slot in [slot for slot in self.unsent if slot[1] < oldest]:
                del self.unsent[slot]
        for (ref, hour), counts in self.unsent.items():
            key = fields.caller_hour_key(prefix, ref, hour)
            for field, value in counts.items():
                pipe.hincrby(key, field, value)
            pipe.expire(key, HISTORY_TTL_S)
        return len(self.unsent)

    def acknowledged(self):
        self.unsent.clear()

    clear = acknowledged


def read_history(client, prefix, ref, now, hours=HISTORY_HOURS):
    """Return the last ``hours`` hours of ``ref`` (the current one last) in one pipeline:
    ``[{"hour": unix start, "allowed", "refused", "units": {rule: n}, "refused_by":
    {rule: n}}]``, zeros where nothing was written. Raises the client's errors."""
    last = int(now // 3600)
    slots = list(range(last - hours + 1, last + 1))
    pipe = client.pipeline(transaction=False)
    for hour in slots:
        pipe.hgetall(fields.caller_hour_key(prefix, ref, hour))
    rows = []
    for hour, reply in zip(slots, pipe.execute()):
        row = {"hour": hour * 3600, "allowed": 0, "refused": 0, "units": {}, "refused_by": {}}
        for raw_field, value in reply.items():
            kind, name = fields.parse_history_field(raw_field)
            if kind in ("allowed", "refused") and not name:
                row[kind] += int(value)
            elif kind == "units":
                row["units"][name] = int(value)
            elif kind == "refused":
                row["refused_by"][name] = int(value)
        rows.append(row)
    return rows
