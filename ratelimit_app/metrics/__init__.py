"""Decision metrics: counted in process on the request path, flushed to Redis off it, read back
for the dashboard and the Prometheus endpoint.

    fields.py    the Redis layout: key names, hash fields, members (built and parsed only there)
    sketch.py    SpaceSaving, the bounded hot-key sketch
    recorder.py  Recorder: counts decisions per minute in process (the request path's part)
    flush.py     Flusher: writes a Recorder to Redis in one round trip, from a background thread,
                 and keeps the counts while Redis is down
    reads.py     Reader: series, breakdowns, hot keys, near-limit, totals for the dashboard
    defaults.py  the Redis client and error count used unless a caller passes its own

Each Limiter owns its Recorder and Flusher (wired to its store: ``default_limiter().recorder``,
``.flusher``); ``record_decision`` and ``reset`` here act on the process's Limiter. The ``read_*``
functions are a stateless Reader's, on the same store.
"""

from .fields import identity_member, parse_member
from .flush import Flusher
from .reads import WINDOWS, Reader
from .recorder import MAX_BUFFERED_MINUTES, MAX_DETAILED_MINUTES, NEAR_LIMIT_CAPACITY, Recorder
from .sketch import SpaceSaving

__all__ = ["record_decision", "SpaceSaving", "Recorder", "Flusher", "Reader",
           "reader", "reset", "identity_member", "parse_member", "WINDOWS",
           "read_series", "read_breakdown", "read_hot_keys", "read_near_limit",
           "read_last_flush_at", "read_totals", "read_buffered_periods",
           "NEAR_LIMIT_CAPACITY", "MAX_DETAILED_MINUTES", "MAX_BUFFERED_MINUTES"]

reader = Reader()

read_series = reader.series
read_breakdown = reader.breakdown
read_hot_keys = reader.hot_keys
read_near_limit = reader.near_limit
read_last_flush_at = reader.last_flush_at
read_buffered_periods = reader.buffered_periods
read_totals = reader.totals


def record_decision(decision):
    """Count one decision in the process's Limiter (no Redis; flushed off the request path)."""
    from ..limiter import default_limiter

    default_limiter().record(decision)


def reset(background=True):
    """Drop the process's Limiter's pending counts, stop its flush thread, and say whether
    decisions may start it again (tests keep it off and flush with ``flusher.flush_now()``)."""
    from ..limiter import default_limiter

    default_limiter().flusher.reset(autostart=background)
