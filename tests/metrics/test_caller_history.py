"""The per-caller hourly history the flush writes (metrics/caller_history.py): from the usage
shapes, keys and users only, kept through a failed flush, bounded to the hours a page reads."""

from collections import defaultdict

from ratelimit_app.metrics.caller_history import HISTORY_HOURS, CallerHistory, hourly_counts
from ratelimit_app.metrics.usage import ANONYMOUS

HOUR = 493_000  # an hour's number (unix time // 3600)


class Minute:
    """The part of a PendingMinute the history reads."""

    def __init__(self, usage):
        self.usage = defaultdict(int, usage)


def shape(ref, allowed, names, costs_or_refusing):
    return ("2026-12-07", (ref, "", ref), allowed, names, costs_or_refusing)


def test_allowed_units_and_refusals_by_rule_per_caller_and_hour():
    minutes = {
        HOUR * 60: Minute({shape("key:1", True, ("global", "free-user"), (1, 1)): 7,
                           shape("key:1", False, ("global", "free-user"), ("free-user",)): 2,
                           shape(ANONYMOUS, True, ("global",), (1,)): 50}),
        HOUR * 60 + 61: Minute({shape("user:3", True, ("reports",), (20,)): 1}),
    }
    counts = hourly_counts(minutes)
    assert dict(counts[("key:1", HOUR)]) == {
        "allowed": 7, "units|global": 7, "units|free-user": 7, "refused": 2,
        "refused|free-user": 2}
    assert dict(counts[("user:3", HOUR + 1)]) == {"allowed": 1, "units|reports": 20}
    assert all(ref != ANONYMOUS for ref, _hour in counts)  # no history per address


class Pipe:
    def __init__(self):
        self.commands = []

    def hincrby(self, key, field, value):
        self.commands.append(("hincrby", key, field, value))

    def expire(self, key, ttl):
        self.commands.append(("expire", key, ttl))


def test_kept_through_a_failed_flush_and_bounded_to_a_day():
    history = CallerHistory()
    history.take({HOUR * 60: Minute({shape("key:1", True, ("global",), (1,)): 3})})
    assert history.queue(Pipe(), "rl") == 1  # the flush failed: not acknowledged
    later = HOUR + HISTORY_HOURS + 1
    history.take({later * 60: Minute({shape("key:1", True, ("global",), (1,)): 1})})
    pipe = Pipe()
    assert history.queue(pipe, "rl") == 1  # the hour no page reads any more is dropped
    assert ("hincrby", f"rl:m:who:key:1:{later}", "allowed", 1) in pipe.commands
    history.acknowledged()
    assert history.queue(Pipe(), "rl") == 0
