"""The clocks a decision reads: the real ones, or a test's (the clock seam).

A Limiter is given a clock (``SystemClock`` unless a test passes its own). The steps that have no
Limiter at hand, such as the bounds of a calendar quota's day, read ``process_clock``: the clock
of the process's Limiter, which the runtime sets whenever it installs or builds one.
"""

import time

__all__ = ["SystemClock", "ProcessClock", "process_clock"]


class SystemClock:
    """Real time: buckets follow the Redis server clock, local state ``time.monotonic``.

    Tests pass a clock whose ``redis_now_ms`` returns a number instead: the script then uses it
    (never the server's), and the deny cache and breaker read the same test time.
    """

    def redis_now_ms(self):
        """Return "now" for the scripts in ms, or None to let Redis read its own clock."""
        return None

    def monotonic(self):
        return time.monotonic()

    def wall_time(self):
        """Return the wall-clock time (epoch s): when dated overrides start and end."""
        return time.time()


class ProcessClock:
    """The clock of the process's Limiter (``runtime.limiter.default_limiter``)."""

    def __init__(self):
        self.clock = SystemClock()

    def use(self, clock):
        """Follow ``clock`` from now on (None: the real clock)."""
        self.clock = clock or SystemClock()

    def now_ms(self):
        """Return "now" in ms: the test clock's time if it sets one, else this host's clock."""
        test_now = self.clock.redis_now_ms()
        return int(time.time() * 1000) if test_now is None else test_now


process_clock = ProcessClock()
