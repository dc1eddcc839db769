"""Reading back what every worker flushed, for the dashboard and the Prometheus endpoint.

Every key read is computed from the window's time slots (see ``fields``); nothing here scans the
keyspace, so the reads work unchanged on Redis Cluster (one key per command). Redis errors are
the caller's to handle: the dashboard shows them, Prometheus reports ``up 0``.
"""

import time
from collections import defaultdict

from ..conf import get_config
from . import fields

__all__ = ["Reader", "WINDOWS"]

# Window name -> (seconds, resolution) read by the dashboard.
WINDOWS = {"5m": (300, "minute"), "1h": (3600, "minute"), "24h": (86400, "hour")}


def _window_slots(window, now):
    """Return the time slots of a window, oldest first: ``(resolution, [slot, ...])``."""
    seconds, resolution = WINDOWS[window]
    length = fields.RESOLUTIONS[resolution][0]
    last = int(now // length)
    return resolution, list(range(last - seconds // length + 1, last + 1))


def _identity_row(member):
    """Return the identity columns of a hot-key member, as the dashboard's rows hold them."""
    ref, plan, display = fields.parse_member(member)
    return {"member": member, "ref": ref, "plan": plan, "display": display}


class Reader:
    """Reads the metrics in Redis. ``client_provider()`` returns the redis-py client (a Limiter
    passes its store's ``metrics_client``); every Redis call goes through it. ``config`` returns
    the RATELIMIT_APP settings dict."""

    def __init__(self, client_provider, config=get_config):
        self.client_provider = client_provider
        self.config = config

    def _prefix(self):
        return self.config()["KEY_PREFIX"]

    def _pipeline(self):
        return self.client_provider().pipeline(transaction=False)

    def series(self, minutes=60, now=None):
        """Return ``[{"minute": unix start, "allowed", "denied", "shadow"}]`` for the last
        ``minutes`` minutes, oldest first (missing minutes are zeros)."""
        now = time.time() if now is None else now
        last = int(now // 60)
        slots = list(range(last - minutes + 1, last + 1))
        prefix, outcomes = self._prefix(), ("allowed", "denied", "shadow")
        wanted = [fields.count_field("all", "", outcome) for outcome in outcomes]
        pipe = self._pipeline()
        for minute in slots:
            pipe.hmget(fields.counts_key(prefix, "minute", minute), wanted)
        return [{"minute": minute * 60, **{o: int(v or 0) for o, v in zip(outcomes, values)}}
                for minute, values in zip(slots, pipe.execute())]

    def breakdown(self, window="1h", now=None):
        """Return counts over a window: ``{"all": {...}, "plan": {name: {...}}, "endpoint": ...,
        "rule": ..., "degraded": ...}`` where each ``{...}`` maps an outcome (allowed, denied,
        shadow, checked, count) to a number."""
        now = time.time() if now is None else now
        resolution, slots = _window_slots(window, now)
        prefix, pipe = self._prefix(), self._pipeline()
        for slot in slots:
            pipe.hgetall(fields.counts_key(prefix, resolution, slot))
        result = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
        for reply in pipe.execute():
            for field, value in reply.items():
                dimension, item, outcome = fields.parse_count_field(field)
                result[dimension][item][outcome] += int(value)
        return {dimension: {item: dict(outcomes) for item, outcomes in items.items()}
                for dimension, items in result.items()}

    def slot_breakdowns(self, resolution, count, dimensions=("plan", "rule"), now=None):
        """Return the counts of the last ``count`` minutes or hours (``resolution``), oldest
        first, the current one last: ``[(slot start unix, {dimension: {name: {outcome: n}}})]``
        for ``dimensions`` (missing slots are empty). Read from the hashes the flush already
        writes per minute and per hour: bounded by the number of plans, rules and endpoints,
        nothing added to what a request or a flush costs."""
        now = time.time() if now is None else now
        length = fields.RESOLUTIONS[resolution][0]
        last = int(now // length)
        slots = list(range(last - count + 1, last + 1))
        prefix, pipe = self._prefix(), self._pipeline()
        for slot in slots:
            pipe.hgetall(fields.counts_key(prefix, resolution, slot))
        result = []
        for slot, reply in zip(slots, pipe.execute()):
            counts = {dimension: defaultdict(dict) for dimension in dimensions}
            for field, value in reply.items():
                dimension, item, outcome = fields.parse_count_field(field)
                if dimension in counts:
                    counts[dimension][item][outcome] = int(value)
            result.append((slot * length, {d: dict(items) for d, items in counts.items()}))
        return result

    def hot_keys(self, window="1h", limit=10, now=None):
        """Return ``{"tokens": rows, "denials": rows}``: the top ``limit`` identities of a window
        by tokens used and by denials. A row is ``{"member", "ref", "plan", "display", "tokens",
        "denials", "requests"}``; a figure beside the ranked one is 0 if it fell out of its
        set."""
        now = time.time() if now is None else now
        resolution, slots = _window_slots(window, now)
        prefix, pipe = self._prefix(), self._pipeline()
        for metric in fields.HOT_METRICS:
            for slot in slots:
                pipe.zrange(fields.hot_key(prefix, metric, resolution, slot), 0, -1,
                            withscores=True)
        replies = iter(pipe.execute())
        totals = {metric: defaultdict(float) for metric in fields.HOT_METRICS}
        for metric in fields.HOT_METRICS:
            for _ in slots:
                for member, score in next(replies):
                    totals[metric][fields.decode(member)] += score
        tables = {}
        for metric in ("tokens", "denials"):
            ranked = sorted(totals[metric].items(), key=lambda item: (-item[1], item[0]))[:limit]
            tables[metric] = [
                {**_identity_row(member),
                 **{m: int(totals[m].get(member, 0)) for m in fields.HOT_METRICS}}
                for member, _score in ranked]
        return tables

    def member_hours(self, ref, hours=24, now=None):
        """Return what the hourly hot-key sets hold of the caller ``ref`` over the last
        ``hours`` hours, oldest first: ``[{"hour": unix start, "requests", "denials"}]``. The
        sets keep only the heaviest callers: an hour a caller was not among them reads 0."""
        now = time.time() if now is None else now
        last = int(now // 3600)
        slots = list(range(last - hours + 1, last + 1))
        prefix, pipe, metrics = self._prefix(), self._pipeline(), ("requests", "denials")
        for metric in metrics:
            for hour in slots:
                pipe.zrange(fields.hot_key(prefix, metric, "hour", hour), 0, -1,
                            withscores=True)
        replies = iter(pipe.execute())
        rows = [{"hour": hour * 3600, "requests": 0, "denials": 0} for hour in slots]
        for metric in metrics:
            for row in rows:
                for member, score in next(replies):
                    if fields.parse_member(member)[0] == ref:
                        row[metric] += int(score)
        return rows

    def near_limit(self, minutes=5, limit=20, now=None):
        """Return the latest near-limit sightings of the last ``minutes`` minutes, newest first:
        ``[{"member", "ref", "plan", "display", "rule", "remaining", "burst", "at"}]``, one per
        identity and rule."""
        now = time.time() if now is None else now
        last = int(now // 60)
        prefix, pipe = self._prefix(), self._pipeline()
        for minute in range(last - minutes + 1, last + 1):
            pipe.zrange(fields.near_key(prefix, minute), 0, -1, withscores=True)
        latest = {}
        for reply in pipe.execute():
            for raw, at in reply:
                sighting = fields.parse_near_entry(raw)
                if sighting is None:
                    continue
                member, rule, remaining, burst = sighting
                if (member, rule) not in latest or latest[member, rule]["at"] < at:
                    latest[member, rule] = {**_identity_row(member), "rule": rule,
                                            "remaining": remaining, "burst": burst, "at": at}
        return sorted(latest.values(), key=lambda row: -row["at"])[:limit]

    def last_flush_at(self):
        """Return the unix time of the latest flush by any process, or None."""
        value = self.client_provider().get(fields.flushed_at_key(self._prefix()))
        return float(value) if value else None

    def buffered_periods(self):
        """Return the latest periods whose metrics were buffered while Redis was unreachable,
        newest first: ``[{"from", "to", "decisions", "dropped", "pid"}]`` (unix times)."""
        entries = self.client_provider().lrange(fields.buffered_key(self._prefix()), 0, -1)
        periods = (fields.parse_period_entry(raw) for raw in entries)
        return [period for period in periods if period is not None]

    def totals(self):
        """Return the all-time counters: ``{(dimension, name, outcome): count}``."""
        raw = self.client_provider().hgetall(fields.totals_key(self._prefix()))
        return {fields.parse_count_field(field): int(value) for field, value in raw.items()}
