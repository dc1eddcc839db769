"""A daemon thread of this process that does one piece of work when woken or at an interval, off
the request path.

The metrics' flush (metrics/flush.py), the alerts' drain (business/alerts/crossings.py) and the
comparison of the quota rows with the rules in memory (config/policy.py) each own one. The thread
starts at the first ``wake()``, and again in a child process forked after it started (a fork copies
no thread: ``is_alive()`` is then False). It uses database connections of its own (Django's are per
thread), closed after each round, so it holds none while it waits; or, with
``keep_connections_s``, closed once they are that old (or failed), so that a thread whose
rounds come close together does not connect again for each. A process forked meanwhile (a
gunicorn master that loaded the app with ``--preload``) hands its children the socket of such
a connection: a child never uses it, nor frees it (some drivers, psycopg2's, would end the
parent's session on it as they free it).
"""

import logging
import math
import os
import sys
import threading
import time
import weakref

from django.db import connections

__all__ = ["WorkerThread"]

logger = logging.getLogger("ratelimit_app")

# The threads that keep connections between rounds, and in a forked child the connections their
# threads held in the parent (kept here, unused, for the life of the child: see the docstring)
_keeping = weakref.WeakSet()
_inherited = []


def _forget_parents_connections():
    for thread in list(_keeping):
        _inherited.extend(thread._kept)
        thread._kept = []


os.register_at_fork(after_in_child=_forget_parents_connections)


class WorkerThread:
    """Run ``work`` (a callable, no arguments) in a thread named ``name`` when woken, and with
    ``every_s`` (a callable returning seconds) at least that often.

    ``work`` handles its own errors; one that escapes is logged and the thread waits for the
    next round, so a bug never stops the work for the life of the process. With
    ``low_priority``, the thread runs at the lowest CPU priority (see ``_lower_priority``);
    with ``final_round``, ``stop()`` has it run ``work`` once more before it ends (what a
    queue's drain needs: nothing left behind). With ``keep_connections_s``, the thread's
    database connections outlive its rounds by up to that long (see ``_release_connections``).
    """

    def __init__(self, work, name, every_s=None, *, low_priority=False, final_round=False,
                 keep_connections_s=0.0):
        self._work = work
        self._keep_connections_s = keep_connections_s
        self._connections_closed_at = -math.inf
        self._kept = []  # the thread's connections kept after its last round (see _release)
        if keep_connections_s:
            _keeping.add(self)
        self.name = name
        self._every_s = every_s
        self._low_priority = low_priority
        self._final_round = final_round
        self._wake = threading.Event()
        # one per started thread: a thread still finishing its round after stop() keeps its
        # own, so starting the next one can never make it go on
        self._stop = threading.Event()
        self._thread = None
        self._start_lock = threading.Lock()

    @property
    def running(self):
        return self._thread is not None and self._thread.is_alive()

    def wake(self):
        """Have the thread run ``work`` once more, as soon as it finishes the round under way
        (wakes while it works count as one); start it if it is not running."""
        self.ensure_running()
        self._wake.set()

    def ensure_running(self):
        if self.running:
            return
        with self._start_lock:  # two first callers at once start one thread
            if not self.running:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,),
                                                name=self.name, daemon=True)
                self._thread.start()

    def stop(self):
        """Stop the thread after the round under way (and its final round, if it has one)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def _run(self, stop):
        if self._low_priority:
            _lower_priority()
        try:
            self._rounds(stop)
        finally:
            self._close_connections()  # those kept (keep_connections_s) end with the thread

    def _rounds(self, stop):
        while True:
            self._wake.wait(self._every_s() if self._every_s is not None else None)
            self._wake.clear()
            stopping = stop.is_set()
            if stopping and not self._final_round:
                return
            try:
                self._work()
            except Exception:
                logger.exception("ratelimit_app: %s failed; it runs again at its next round",
                                 self.name)
            finally:
                self._release_connections()
            if stopping:
                return

    def _release_connections(self):
        """Close this thread's database connections (``connections`` is per thread), or, with
        ``keep_connections_s``, only once that long has passed since they were last closed (and
        any that failed meanwhile at once)."""
        now = time.monotonic()
        if now - self._connections_closed_at >= self._keep_connections_s:
            self._close_connections()
            self._connections_closed_at = now
            return
        for connection in connections.all(initialized_only=True):
            if connection.errors_occurred or connection.in_atomic_block:
                connection.close()
        # held here too, not only in the thread's locals, which a fork clears in the child
        self._kept = [connection for connection in connections.all(initialized_only=True)
                      if connection.connection is not None]

    def _close_connections(self):
        connections.close_all()
        self._kept = []


def _lower_priority():
    """Give the calling thread the lowest CPU priority (nice 19), so that the cores go to
    requests (this worker's, other workers', Redis) whenever they want them. Linux schedules
    each thread on its own; elsewhere setpriority would lower the whole process, so this
    does nothing there."""
    if not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError as exc:  # not expected on Linux; the work runs at the normal priority then
        logger.warning("ratelimit_app: could not lower the priority of a background thread "
                       "(%s)", exc)
