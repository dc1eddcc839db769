"""The stop request of a long-running command (``ratelimit deliver``, ``ratelimit rollup
--every``): SIGINT or SIGTERM asks it to stop between two rounds, after the one under way.

Why not a ``threading.Event`` set by the signal handler: Python runs a handler in the main
thread between two bytecodes, wherever that thread is, and ``Event.set()`` takes the Event's
lock, which the main thread itself holds for a moment inside ``Event.wait()``. A signal in that
moment deadlocks the process for good (the likely reason ``make run``, whose cleanup waits for
the webhook sender, once hung on SIGTERM). The handler here takes no lock: it writes a byte to
a pipe, and ``wait`` is a ``select`` on that pipe, which also wakes on a signal that arrived
just before it began.
"""

import os
import select
import signal


class StopSignal:
    """What ``Event`` offers a loop (``is_set``, ``wait``, ``set``), set by ``signals``.

    Installs its handlers when made, so make it in the main thread (as Python requires)."""

    def __init__(self, signals=(signal.SIGINT, signal.SIGTERM)):
        self._stopped = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)  # a handler must never block on a full pipe
        self._previous = {number: signal.signal(number, self._on_signal) for number in signals}

    def _on_signal(self, number, frame):
        self.set()

    def set(self):
        self._stopped = True
        try:
            os.write(self._wake_write, b"!")
        except BlockingIOError:
            pass  # the pipe already holds wake-ups enough

    def is_set(self):
        return self._stopped

    def wait(self, timeout=None):
        """Return once stopped or after ``timeout`` seconds; True if stopped."""
        if not self._stopped:
            select.select([self._wake_read], [], [], timeout)
        return self._stopped

    def close(self):
        """Give the signals back their previous handlers and close the pipe."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        os.close(self._wake_read)
        os.close(self._wake_write)
