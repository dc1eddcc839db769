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

A call on redis-py's plain connections (TCP, TLS, Unix socket) goes through a ``Wire``: the
command is written to the connection's socket and the reply read with a hiredis reader of our
own, skipping ``send_packed_command`` and ``read_response`` (their checks, error translation
and parser layers: about 2.5 µs of CPU per call on the development machine). redis-py still
opens, authenticates and closes the connection, and its parser's ``parse_error`` turns error
replies into its exceptions. Other connection classes (Sentinel's, which reacts to READONLY in
its ``read_response``; client-side caching proxies) and a process without hiredis use the
connection's own methods.

On a socket with a timeout (redis-py's ``socket_timeout``), CPython polls before every send and
every receive: four system calls per round trip instead of two. A Wire on a plain socket moves
the timeout into the kernel instead (``SO_SNDTIMEO``/``SO_RCVTIMEO``, Linux) and puts the socket
in blocking mode: the same timeout per send and receive, about 1.5 µs of CPU less per decision
on the development machine. The socket gets its timeout back before redis-py uses it again
(``Wire.restore``); one that redis-py set again meanwhile is moved by the next exchange.

Between writing a command and reading its reply the process only waits (tens of microseconds
for a round trip even on one host). ``while_waiting``, when set, is run in that gap: the Limiter
counts the metrics of earlier decisions there, work that would otherwise run after the reply,
in the request's time.

A command may also be sent without waiting for its reply (``send_unanswered``: a metered
request's settle, after its response). The connection then owes that reply, and its callback
runs once it is read: before the connection's next ``request`` (the reply is there by then),
in one go once MAX_UNANSWERED are owed, when the connection sat idle past
``recheck_after_s``, or by ``collect`` (the metrics flush). Redis has applied the command as it
arrived; only the wait is gone.
"""

import os
import socket
import struct
import sys
import time

from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError, InvalidResponse, ResponseError, TimeoutError

try:
    import hiredis
except ImportError:  # pragma: no cover - hiredis is a requirement; redis-py works without it
    hiredis = None
PUSH = getattr(hiredis, "PushNotification", None)  # a RESP3 push message (hiredis ≥ 3.2)

__all__ = ["HeldConnections", "Wire"]

# the connection classes whose sockets carry nothing but the commands sent and their replies
WIRE_CLASSES = (Connection, SSLConnection, UnixDomainSocketConnection)
# kernel timeouts take a struct timeval (two C longs on Linux's 64-bit ABIs)
_TIMEVAL = struct.Struct("ll")
# replies a connection may owe (commands sent by HeldConnections.send_unanswered, their replies
# not read yet) before the next such command reads them: calls sent back to back have their
# replies read in one go, mostly from one receive, instead of a wait for each
MAX_UNANSWERED = 32
KERNEL_TIMEOUTS = sys.platform == "linux" and _TIMEVAL.size == 16


class _Forks:
    """How many forks led to this process (0 in the one that imported this module): a child
    (gunicorn --preload) sees a new number. Compared per decision instead of ``os.getpid()``,
    a system call (about 0.5 µs on the development machine)."""

    generation = 0

    @classmethod
    def _count_fork(cls):
        cls.generation += 1


os.register_at_fork(after_in_child=_Forks._count_fork)


class HeldConnections:
    """Connections of ``pool`` held for one store's decisions."""

    def __init__(self, pool, recheck_after_s=0.005):
        self.pool = pool
        self.recheck_after_s = recheck_after_s
        # (connection, monotonic time it was last used, its Wire or None, the callbacks of the
        # replies sent for and not read yet: send_unanswered)
        self._idle = []
        self._fork_generation = _Forks.generation
        # run between writing a command and reading its reply (see the module's docstring);
        # it must not raise
        self.while_waiting = None

    def request(self, packed_command):
        """Send ``packed_command`` (bytes or a list of bytes) and return its reply; redis-py's
        errors propagate. An error reply (NOSCRIPT, READONLY) leaves the connection in use."""
        connection, now, wire, _ = self._ready_connection(owed_kept=0)
        try:
            if wire is None:
                connection.send_packed_command(packed_command, check_health=False)
                if self.while_waiting is not None:
                    self.while_waiting()
                reply = connection.read_response()
            else:
                reply = wire.exchange(packed_command, self.while_waiting)
        except ResponseError:
            self._idle.append((connection, now, wire, ()))
            raise
        except BaseException:
            # a reply may still be on its way (a timeout, an interrupt): never reuse the socket
            connection.disconnect()
            self.pool.release(connection)
            raise
        self._idle.append((connection, now, wire, ()))
        return reply

    def send_unanswered(self, packed_command, on_reply):
        """Send ``packed_command`` and return without waiting for its reply: ``on_reply`` is
        called with it (an error reply, or the failure that lost it: the exception) once it is
        read, in whichever thread that is: before that connection's next ``request``, by
        ``collect``, or by a ``send_unanswered`` that finds MAX_UNANSWERED replies owed on it
        or finds it idle for longer than ``recheck_after_s`` (their replies have arrived by
        then). ``on_reply`` must not raise. redis-py's errors in sending propagate
        (``on_reply`` is then never called). What a settle costs its request."""
        connection, now, wire, owed = self._ready_connection(owed_kept=MAX_UNANSWERED)
        try:
            if wire is None:
                connection.send_packed_command(packed_command, check_health=False)
            else:
                wire.send(packed_command)
        except BaseException:
            connection.disconnect()  # a command written in part: the socket is not reused
            self.pool.release(connection)
            for on_earlier_reply in owed:  # (their replies are lost with the socket)
                on_earlier_reply(ConnectionError("the connection failed before its reply"))
            raise
        self._idle.append((connection, now, wire, owed + (on_reply,)))

    def collect(self):
        """Read the replies still unread on the idle connections (``send_unanswered``), and
        hand each to its ``on_reply``: what the metrics flush does, so that an idle worker's
        last replies are not left waiting for its next request."""
        if not any(owed for _, _, _, owed in list(self._idle)):
            # nothing owed (no metered traffic): the connections stay where they are, so no
            # decision meanwhile finds the stack empty and opens one more
            return
        held = []
        while True:
            try:
                connection, used_at, wire, unanswered = self._idle.pop()
            except IndexError:
                break
            if unanswered:
                self._read_unanswered(connection, wire, unanswered)
            held.append((connection, used_at, wire, ()))
        self._idle.extend(held)

    def _ready_connection(self, owed_kept):
        """Take an idle connection (or one from the pool), checked if it sat idle; return
        ``(connection, now, wire, owed)``: ``owed`` the callbacks of the replies it still owes
        (fewer than ``owed_kept``, on a connection used within ``recheck_after_s``). Those it
        owed beyond are read and handed on first."""
        if self._fork_generation != _Forks.generation:
            # a forked child (gunicorn --preload): the parent's sockets are not its own; the
            # connections are dropped without a word to the server (redis-py only shuts a
            # socket down in the process that opened it)
            self._idle, self._fork_generation = [], _Forks.generation
        try:
            connection, used_at, wire, unanswered = self._idle.pop()
        except IndexError:
            connection, used_at, wire, unanswered = self.pool.get_connection(), None, None, ()
        now = time.monotonic()
        idle_long = used_at is not None and now - used_at > self.recheck_after_s
        if unanswered and (idle_long or len(unanswered) >= owed_kept):
            # before the staleness check, to which those replies would be stray data
            self._read_unanswered(connection, wire, unanswered)
            unanswered = ()
        try:
            if idle_long:
                self._reopen_if_stale(connection)
            if wire is None or wire.sock is not connection._sock:
                wire = Wire.for_connection(connection)  # a new (or reopened) connection
        except BaseException:
            connection.disconnect()
            self.pool.release(connection)
            for on_reply in unanswered:  # (their replies are lost with the socket)
                on_reply(ConnectionError("the connection failed before its reply"))
            raise
        return connection, now, wire, unanswered

    @staticmethod
    def _read_unanswered(connection, wire, unanswered):
        """Read the replies of ``unanswered`` (callbacks, in the order their commands were
        sent) on ``connection`` and hand each on. A failure to read closes the connection (it
        reopens at its next use) and is handed to every callback still waiting."""
        for position, on_reply in enumerate(unanswered):
            try:
                if wire is not None and wire.sock is connection._sock:
                    reply = wire.read_reply()
                else:
                    reply = connection.read_response()
            except ResponseError as error:
                reply = error  # the command's own answer: the connection is fine
            except Exception as error:  # noqa: BLE001 - the callbacks decide what it means
                connection.disconnect()
                for waiting in unanswered[position:]:
                    waiting(error)
                return
            on_reply(reply)

    def release_unowned(self):
        """Give back the idle connections the pool no longer owns (a Sentinel pool whose master
        moved disowns the connections to the old one, and closes them when given back)."""
        kept = []
        while True:
            try:
                held = self._idle.pop()
            except IndexError:
                break
            connection, used_at, wire, unanswered = held
            if unanswered:
                self._read_unanswered(connection, wire, unanswered)
                held = (connection, used_at, wire, ())  # (each reply is handed on once)
            if self.pool.owns_connection(connection):
                kept.append(held)
            else:
                _give_back(self.pool, connection, wire)
        self._idle.extend(kept)

    def give_back(self):
        """Give the idle connections back to the pool (a replaced store's)."""
        while True:
            try:
                connection, _, wire, unanswered = self._idle.pop()
            except IndexError:
                return
            if unanswered:
                self._read_unanswered(connection, wire, unanswered)
            _give_back(self.pool, connection, wire)

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


def _give_back(pool, connection, wire):
    """Give ``connection`` back to ``pool`` with its socket as redis-py left it."""
    if wire is not None and wire.sock is connection._sock:
        wire.restore()
    pool.release(connection)


class Wire:
    """A connected redis-py connection's socket and a hiredis reader of our own: one command
    written, its reply read. Built per socket (``sock`` tells a reopened connection apart)."""

    __slots__ = ("sock", "reader", "buffer", "timeout")

    def __init__(self, sock, parse_error):
        self.sock = sock
        # error replies become the exceptions redis-py's parser would raise (NoScriptError,
        # ReadOnlyError, a cluster parser's ClusterCrossSlotError, ...)
        self.reader = hiredis.Reader(protocolError=InvalidResponse, replyError=parse_error)
        self.buffer = bytearray(16384)
        # the socket's own timeout, given back by restore(); None: it stays as it is
        self.timeout = self._time_out_in_kernel(sock)

    @staticmethod
    def _time_out_in_kernel(sock):
        """Give a plain socket with a timeout the same timeout in the kernel, so that it can
        block without CPython's poll (see the module's docstring). Returns the socket's
        timeout, or None when it keeps it (no timeout, TLS, not Linux)."""
        timeout = sock.gettimeout()
        if not KERNEL_TIMEOUTS or type(sock) is not socket.socket or not timeout:
            return None
        # (at least 1 µs: a zero timeval means no timeout at all)
        timeval = _TIMEVAL.pack(*divmod(max(1, round(timeout * 1_000_000)), 1_000_000))
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            sock.settimeout(None)
        except OSError:
            sock.settimeout(timeout)
            return None
        return timeout

    def restore(self):
        """Give the socket its own timeout back (before redis-py uses it again)."""
        if self.timeout is not None:
            self.sock.settimeout(self.timeout)

    @classmethod
    def for_connection(cls, connection):
        """Return the Wire of ``connection`` (connecting it first), or None when its own
        methods must serve it (see the module's docstring)."""
        if hiredis is None or type(connection) not in WIRE_CLASSES or \
                not hasattr(connection, "_sock"):
            return None
        if connection._sock is None:
            connection.connect()
        parse_error = getattr(connection._parser, "parse_error", None)
        return cls(connection._sock, parse_error) if parse_error is not None else None

    def exchange(self, packed_command, while_waiting=None):
        """Send ``packed_command`` (a list of bytes, as ``pack_command`` returns), run
        ``while_waiting`` (if given) and return the reply; an error reply is raised as
        redis-py's exception for it."""
        self.send(packed_command)
        if while_waiting is not None:
            while_waiting()
        return self.read_reply()

    def send(self, packed_command):
        """Write ``packed_command`` (a list of bytes) to the socket."""
        sock = self.sock
        if sock.timeout is not None and self.timeout is not None:
            # redis-py set a timeout again (an older parser's can_read; a relaxed timeout
            # during a server's maintenance): the kernel takes that one
            self.timeout = self._time_out_in_kernel(sock)
        try:
            for part in packed_command:
                sock.sendall(part)
        except (socket.timeout, BlockingIOError):  # a Python timeout, or the kernel's (EAGAIN)
            raise TimeoutError("Timeout writing to socket") from None

    def read_reply(self):
        """Read the next reply; an error reply is raised as redis-py's exception for it."""
        sock, reader, buffer = self.sock, self.reader, self.buffer
        try:
            while True:
                reply = reader.gets()
                if reply is False:  # not all of it has arrived
                    received = sock.recv_into(buffer)
                    if not received:
                        raise ConnectionError("Connection closed by server.")
                    reader.feed(buffer, 0, received)
                # RESP3 (redis-py's default protocol from 8.0 on) lets a server push messages
                # between replies (redis-py asks for maintenance notices): not replies, skipped
                # (a server that moved is noticed when the connection fails)
                elif type(reply) is not PUSH:
                    break
        except (socket.timeout, BlockingIOError):  # a Python timeout, or the kernel's (EAGAIN)
            raise TimeoutError("Timeout reading from socket") from None
        if isinstance(reply, ResponseError):
            raise reply
        return reply
