"""``HeldConnections``: the connections a store's decisions run on, taken from a redis-py pool
once and kept between decisions.

Why not check one out of the pool per decision: redis-py's ``get_connection`` / ``release`` take
the pool's lock, record connection metrics and poll the socket for stray data, about 17 µs of
CPU per call measured on the development machine, more than half of what the client spends on
the whole round trip. Here a decision pops a connection off an idle stack and pushes it back
(list ``pop`` and ``append`` are atomic in CPython: no lock), so the stack never holds more
connections than threads that decided at the same moment, and a thread per request (runserver)
does not leak one each.

What the pool's poll is for is kept where it can help: a connection idle for longer than
``recheck_after_s`` is checked the same way before it is used, so one that Redis closed while it
sat idle (a restart, Redis's idle ``timeout``) is reopened instead of failing a decision. Under
load a worker's connection is never idle that long, and a check could not tell a server that
dies during the call anyway. A connection whose call failed is closed and given back to the pool.
"""

import os
import time

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

__all__ = ["HeldConnections"]


class HeldConnections:
    """Connections of ``pool`` held for one store's decisions."""

    def __init__(self, pool, recheck_after_s=0.005):
        self.pool = pool
        self.recheck_after_s = recheck_after_s
        self._idle = []  # (connection, monotonic time it was last used)
        self._pid = os.getpid()

    def request(self, packed_command):
        """Send ``packed_command`` (bytes or a list of bytes) and return its reply; redis-py's
        errors propagate. An error reply (NOSCRIPT, READONLY) leaves the connection in use."""
        if self._pid != os.getpid():
            # a forked child (gunicorn --preload): the parent's sockets are not its own; the
            # connections are dropped without a word to the server (redis-py only shuts a
            # socket down in the process that opened it)
            self._idle, self._pid = [], os.getpid()
        try:
            connection, used_at = self._idle.pop()
        except IndexError:
            connection, used_at = self.pool.get_connection(), None
        now = time.monotonic()
        try:
            if used_at is not None and now - used_at > self.recheck_after_s:
                self._reopen_if_stale(connection)
            connection.send_packed_command(packed_command, check_health=False)
            reply = connection.read_response()
        except ResponseError:
            self._idle.append((connection, now))
            raise
        except BaseException:
            # a reply may still be on its way (a timeout, an interrupt): never reuse the socket
            connection.disconnect()
            self.pool.release(connection)
            raise
        self._idle.append((connection, now))
        return reply

    def release_unowned(self):
        """Give back the idle connections the pool no longer owns (a Sentinel pool whose master
        moved disowns the connections to the old one, and closes them when given back)."""
        kept = []
        while True:
            try:
                connection, used_at = self._idle.pop()
            except IndexError:
                break
            if self.pool.owns_connection(connection):
                kept.append((connection, used_at))
            else:
                self.pool.release(connection)
        self._idle.extend(kept)

    def give_back(self):
        """Give the idle connections back to the pool (a replaced store's)."""
        while True:
            try:
                connection, _ = self._idle.pop()
            except IndexError:
                return
            self.pool.release(connection)

    @staticmethod
    def _reopen_if_stale(connection):
        """Close ``connection`` if its socket has data nobody asked for, or was closed by the
        server; the next send opens a new one (as the pool does on checkout)."""
        try:
            stale = connection.can_read()
        except (ConnectionError, TimeoutError, OSError):
            stale = True
        if stale:
            connection.disconnect()
