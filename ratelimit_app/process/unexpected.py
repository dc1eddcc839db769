"""Unexpected errors on the decision path: counted apart from Redis being down, and logged loudly
but at a bounded rate.

Redis being unreachable is an expected failure: the store raises StoreUnavailable, the circuit
breaker and the rules' fail modes handle it, and ``LimiterStats.redis_errors`` counts it.
Anything else that escapes a decision (a bug, or a library incompatibility such as redis-py
5.0's ``get_connection()`` signature) is caught by ``runtime/guard.py`` so that the request
still gets its response, let through unlimited. That is exactly the failure that must not pass unnoticed:
it usually hits *every* request. So each one is counted (``LimiterStats.unexpected_errors``, and
per exception type for Prometheus) and logged at ERROR with its type and traceback.

A broken decision path at a thousand requests a second must not write a thousand tracebacks a
second, though: ``UnexpectedErrorLog`` logs each exception type in full at most once per
``interval_s``, and its next line says how many it left out meanwhile. Memory stays bounded:
at most ``max_types`` exception types are tracked, by the log and by the counters alike; any
further type is counted under ``OTHER``.
"""

import logging
import threading
import time

__all__ = ["UnexpectedErrorLog", "type_label", "error_text", "OTHER", "MAX_TYPES", "LOG_INTERVAL_S"]

logger = logging.getLogger("ratelimit_app")

# exception types tracked per process (a label each in Prometheus); then OTHER
MAX_TYPES = 20
OTHER = "other"
# at most one full traceback per exception type per this many seconds
LOG_INTERVAL_S = 60.0


def type_label(error, known, max_types=MAX_TYPES):
    """Return the name ``error`` is counted under: its type's name, or OTHER when ``known``
    (the names counted so far) already holds ``max_types`` other names."""
    name = type(error).__name__
    if name in known or len(known) < max_types:
        return name
    return OTHER


class UnexpectedErrorLog:
    """Logs unexpected errors, each exception type at most once per ``interval_s`` (seconds of
    ``clock``, a monotonic clock). Owned by a Limiter; thread-safe."""

    def __init__(self, *, clock=time.monotonic, interval_s=LOG_INTERVAL_S, max_types=MAX_TYPES,
                 log=logger):
        self.clock = clock
        self.interval_s = interval_s
        self.max_types = max_types
        self.log = log
        self._lock = threading.Lock()
        # type name -> [monotonic time of its last full log line, errors left out since]
        self._types = {}

    def report(self, error, action):
        """Log ``error``, an exception that escaped ``action`` (e.g. "deciding a request;
        request allowed"), unless its type was logged less than ``interval_s`` ago. Returns
        True if it was logged."""
        now = self.clock()
        with self._lock:
            label = type_label(error, self._types, self.max_types)
            state = self._types.get(label)
            if state is not None and now - state[0] < self.interval_s:
                state[1] += 1
                return False
            left_out = state[1] if state is not None else 0
            self._types[label] = [now, 0]
        since = ""
        if left_out:
            since = (f" ({left_out} more {label} since the last report {now - state[0]:.0f} s "
                     f"ago were not logged)")
        self.log.error("ratelimit_app: unexpected %s while %s: %s%s (a bug or a library "
                       "incompatibility, not Redis being down; run manage.py ratelimit check)",
                       type(error).__name__, action, error_text(error), since, exc_info=error)
        return True


def error_text(error, limit=500):
    """Return ``str(error)``, cut to ``limit`` characters (for logs and the dashboard)."""
    text = str(error)
    return text if len(text) <= limit else text[:limit] + "…"
