"""Decision metrics: counted in process on the request path, flushed to Redis off it, read back
for the dashboard and the Prometheus endpoint.

    fields.py    the Redis layout: key names, hash fields, members (built and parsed only there)
    sketch.py    SpaceSaving, the bounded hot-key sketch
    recorder.py  Recorder: counts decisions per minute in process (the request path's part)
    flush.py     Flusher: writes a Recorder to Redis in one round trip, from a background thread,
                 and keeps the counts while Redis is down
    reads.py     Reader: series, breakdowns (per window and per slot), hot keys, near-limit,
                 totals for the dashboard
    usage.py     usage records for billing: the calendar day, the caller, the counts per rule
                 (rolled up into the database by business/usage/rollup.py)
    caller_history.py  each key's and user's last day per hour, written by the flush from the
                 usage's counts (the caller's page)
    models.py    Dashboard: the table-less model behind the dashboard's page and permissions

Each Limiter owns a Recorder, a Flusher and a Reader, wired to its store
(``default_limiter().recorder``, ``.flusher``, ``.reader``): nothing here knows the Limiter.
"""

from .fields import identity_member, parse_member
from .flush import Flusher
from .reads import WINDOWS, Reader
from .recorder import (COUNT_BATCH, MAX_BUFFERED_MINUTES, MAX_DETAILED_MINUTES,
                       NEAR_LIMIT_CAPACITY, WAIT_BATCH, Recorder)
from .sketch import SpaceSaving

__all__ = ["SpaceSaving", "Recorder", "Flusher", "Reader", "identity_member", "parse_member",
           "WINDOWS", "WAIT_BATCH", "COUNT_BATCH", "NEAR_LIMIT_CAPACITY", "MAX_DETAILED_MINUTES",
           "MAX_BUFFERED_MINUTES"]
