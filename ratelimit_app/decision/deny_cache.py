"""A per-process memory of recent denials, so a client hammering while denied costs no Redis call.

Why it only denies what Redis would deny: when Redis answered a request at its time T, every
bucket of that request held some level L afterwards (after the debit, if it was allowed). Until
the config changes, a bucket's level can only grow by refill: other requests debit it, never
credit it. So at any later time its level is at most ``L + refill × elapsed``. We measure
``elapsed`` from the moment the call was *sent* (T is later than that), which overestimates the
refill, and add a safety margin for the network trip of the request we do not send. If that upper
bound is still below the cost of a new request for an enforced bucket, Redis would certainly deny
it as well, and we answer locally.

What would invalidate the bound: a rule edit, an override, or a bucket reset from the dashboard.
Each of these bumps the config version, and an entry is used only while the worker's snapshot
has the version the entry was written at; a worker drops every entry as soon as it sees a newer
version (its watcher polls every CONFIG_WATCH_INTERVAL_S), before it has compiled the new rules,
and answers from here only while that version was confirmed within two polls (the Limiter asks
PolicyCache.confirmed_recently). So a refusal from here after a publication comes at most about
two polls after it: the one decision on older rules the fence cannot catch (it makes no Redis
call), bounded.
A Redis restart that loses the buckets is the one case where Redis would briefly be more lenient;
entries live at most until the bucket would be full again, so that window is bounded too.
"""

import operator
import threading
import time

from .buckets import CreditBalance, LevelStatuses

__all__ = ["DenyCache"]

# Refill we pretend happened during the trip to Redis of the request we do not send (its
# one-way latency; local or same-rack Redis answers a whole round trip in well under 1 ms).
# Every request in this window before a token is due goes to Redis, so a larger margin costs
# Redis calls under a flood; raise it only for a Redis across a slow network.
SAFETY_MARGIN_S = 0.002


_level = operator.attrgetter("level_units")  # a PolicyStatus's
_short_below = operator.attrgetter("short_below")  # a Bucket's


class DenyCache:
    def __init__(self, max_entries=10_000, clock=time.monotonic):
        self.max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries = {}  # bucket id -> (level_units, sent_at, version, expires_at)
        self.hits = 0

    def now(self):
        """Return this cache's clock reading (seconds); take ``sent_at`` from here."""
        return self._clock()

    def clear(self):
        with self._lock:
            self._entries.clear()

    def forget(self, buckets):
        """Drop what is known of ``buckets``: their levels rose by more than the refill (a
        cost given back after the response), so a remembered level no longer bounds them."""
        with self._lock:
            for bucket in buckets:
                self._entries.pop(bucket.id, None)

    def __len__(self):
        return len(self._entries)

    def learn(self, buckets, statuses, allowed, version, sent_at):
        """Remember a reply from Redis if it can answer later requests: every denial, and an
        allowed call that left an enforced bucket short of the same cost (the next identical
        request would be denied, so there is no need to ask)."""
        # (compared in C: no Python frame per bucket on the common path)
        # (a LevelStatuses carries the reply's levels: no status is built to read them)
        levels = statuses.levels if type(statuses) is LevelStatuses else map(_level, statuses)
        if allowed and not any(map(operator.lt, levels, map(_short_below, buckets))):
            return  # the common case: every enforced bucket holds the cost again: nothing to add
        self.remember(buckets, statuses, version, sent_at)

    def remember(self, buckets, statuses, version, sent_at):
        """Record the bucket levels Redis reported for a request; ``sent_at`` is the clock
        reading taken just before the call was sent."""
        now = self._clock()
        with self._lock:
            if len(self._entries) + len(buckets) > self.max_entries:
                self._prune(now, room=len(buckets))
            for bucket, status in zip(buckets, statuses):
                if type(bucket) is CreditBalance:
                    continue  # a top-up may raise it at any moment: never answered from here
                level = status.level_units
                full_after_s = (bucket.capacity_units - level) / bucket.rule.rate / 1000
                self._entries[bucket.id] = (level, sent_at, version, sent_at + full_after_s)

    def lookup(self, buckets, version):
        """Return projected statuses if Redis would certainly deny this request, else None."""
        if not self._entries:
            return None
        now = self._clock()
        projected = []
        deny = False
        for bucket in buckets:
            capacity = bucket.capacity_units
            entry = self._entries.get(bucket.id)
            if entry is None or entry[2] != version:
                upper = capacity  # nothing known: it may be full
            else:
                level, sent_at = entry[0], entry[1]
                upper = min(capacity,
                            level + bucket.rule.rate * (now - sent_at + SAFETY_MARGIN_S) * 1000)
            short = upper < bucket.cost_units
            deny = deny or (short and not bucket.rule.shadow)
            projected.append((bucket, upper, short))
        if not deny:
            return None
        self.hits += 1
        return tuple(bucket.status(upper, short) for bucket, upper, short in projected)

    def _prune(self, now, room):
        """Drop entries of buckets that are full again, then the oldest, until ``room`` fit."""
        for key in [k for k, e in self._entries.items() if now >= e[3]]:
            del self._entries[key]
        while self._entries and len(self._entries) + room > self.max_entries:
            del self._entries[next(iter(self._entries))]

