"""A circuit breaker so that, while Redis is down, requests do not each wait out a timeout."""

import threading
import time

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Closed → open after ``failures_to_open`` consecutive failures → after ``cooldown_s`` one
    trial call is let through (half-open) → closed again on its success, open again on failure.
    """

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"

    def __init__(self, failures_to_open, cooldown_s, clock=time.monotonic):
        self.failures_to_open = max(1, int(failures_to_open))
        self.cooldown_s = float(cooldown_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at = None
        self._trial_running = False
        self.times_opened = 0

    @property
    def state(self):
        with self._lock:
            if self._opened_at is None:
                return self.CLOSED
            if self._trial_running or self._clock() - self._opened_at >= self.cooldown_s:
                return self.HALF_OPEN
            return self.OPEN

    def allow_call(self):
        """Return True if a call to Redis may be attempted now."""
        if self._opened_at is None:
            return True  # closed: the common case needs no lock
        with self._lock:
            if self._opened_at is None:
                return True
            if self._trial_running or self._clock() - self._opened_at < self.cooldown_s:
                return False
            self._trial_running = True  # exactly one trial while half-open
            return True

    def record_success(self):
        if self._opened_at is None and self._failures == 0:
            return  # already closed and clean: nothing to write, no lock
        with self._lock:
            self._failures = 0
            self._opened_at = None
            self._trial_running = False

    def record_failure(self):
        with self._lock:
            self._failures += 1
            if self._trial_running or self._failures >= self.failures_to_open:
                if self._opened_at is None or self._trial_running:
                    self.times_opened += 1
                self._opened_at = self._clock()
                self._trial_running = False
