"""``AsyncWire``: one Redis connection per event loop, shared by every coroutine of that loop,
speaking RESP through an ``asyncio.Protocol`` and a hiredis reader. The async twin of the sync
store's ``Wire`` (stores/connections.py).

Why not redis.asyncio: each of its calls checks a connection out of a pool behind an
``asyncio.Lock``/``Condition``, wraps the exchange in ``async with`` blocks and timeouts that
create tasks or timer handles, encodes the arguments anew and parses the reply in Python
layers; measured under uvicorn, that was most of what the async path cost over the sync one
(see docs/explanation/performance.md). Here a call is: bytes encoded once, appended to what
this turn of the loop writes (the commands of every coroutine that called in the same turn go
out in one ``transport.write``), one future appended to a FIFO, and the reply fed to hiredis in
``data_received``.

Pipelining is safe because Redis answers the commands of one connection in the order it
received them: ``data_received`` hands each complete reply to the oldest waiting future. A
future whose caller gave up (a cancelled request) stays in the FIFO until its reply arrives,
so the replies after it still reach their own callers.

Failures: a connection that is lost, or whose oldest request gets no reply within
``timeout_s`` (the cache's SOCKET_TIMEOUT), is closed and every request waiting on it fails
with redis-py's ConnectionError or TimeoutError (a reply still on its way could otherwise be
handed to the wrong request). The next request opens a new connection. Nothing is retried
here: a take whose reply was lost may have debited.
"""

import asyncio
import collections

import hiredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError, InvalidResponse, ResponseError, TimeoutError

__all__ = ["AsyncWire"]

PUSH = getattr(hiredis, "PushNotification", None)  # a RESP3 push message (hiredis ≥ 3)


class _RespProtocol(asyncio.Protocol):
    """The protocol object of one connection: writes commands, hands replies to futures in
    order."""

    def __init__(self, loop, timeout_s, while_waiting=None):
        self.loop = loop
        self.timeout_s = timeout_s
        # run once a turn's commands are written, while Redis runs them (it must not raise)
        self.while_waiting = while_waiting
        self.transport = None
        self.closed = False
        # error replies become redis-py's exceptions (NoScriptError, ReadOnlyError, ...)
        self.reader = hiredis.Reader(protocolError=InvalidResponse,
                                     replyError=BaseParser.parse_error)
        self.waiting = collections.deque()  # (future, deadline in loop time), oldest first
        self._timer = None  # armed for the oldest request's deadline while any waits
        # commands sent during one turn of the loop, written together at its end: under load
        # several requests reach Redis in one write (one system call here, one read there)
        self._outgoing = []

    def connection_made(self, transport):
        self.transport = transport

    def send(self, command):
        """Write ``command`` (bytes); return the future of its reply."""
        future = self.loop.create_future()
        if self.timeout_s is None:
            self.waiting.append((future, None))
        else:
            deadline = self.loop.time() + self.timeout_s
            self.waiting.append((future, deadline))
            if self._timer is None:
                self._timer = self.loop.call_at(deadline, self._check_deadline)
        outgoing = self._outgoing
        if not outgoing:
            self.loop.call_soon(self._flush)
        outgoing.append(command)
        return future

    def _flush(self):
        outgoing, self._outgoing = self._outgoing, []
        if not self.closed:
            self.transport.write(outgoing[0] if len(outgoing) == 1 else b"".join(outgoing))
            if self.while_waiting is not None:
                self.while_waiting()

    def data_received(self, data):
        reader, waiting = self.reader, self.waiting
        reader.feed(data)
        while True:
            try:
                reply = reader.gets()
            except InvalidResponse as exc:
                self._fail(exc)
                return
            if reply is False:  # not all of it has arrived
                return
            if type(reply) is PUSH:  # not a reply (RESP3 server push)
                continue
            if not waiting:
                self._fail(InvalidResponse("Redis sent a reply nobody asked for"))
                return
            future = waiting.popleft()[0]
            if future.done():  # its caller gave up (cancelled)
                continue
            if isinstance(reply, ResponseError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc):
        detail = f": {exc}" if exc is not None else ""
        self._fail(ConnectionError(f"Connection closed by server{detail}."))

    def _check_deadline(self):
        """Timer callback: fail everything if the oldest request is past its deadline, else
        wait for the oldest one's deadline."""
        self._timer = None
        if not self.waiting:
            return
        deadline = self.waiting[0][1]
        if deadline <= self.loop.time():
            self._fail(TimeoutError("Timeout reading from socket"))
        else:
            self._timer = self.loop.call_at(deadline, self._check_deadline)

    def _fail(self, error):
        """Close the connection; every waiting request fails with ``error``."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.abort()  # drop unsent data: no reply may be taken for another's
        waiting, self.waiting = self.waiting, collections.deque()
        for future, _ in waiting:
            if not future.done():
                future.set_exception(error)

    def close(self):
        self._fail(ConnectionError("Connection closed by the client."))


class AsyncWire:
    """The connection of one event loop to one Redis node (opened on first use, reopened after
    a failure). ``address`` is ``(host, port)`` or a Unix socket path; ``setup_commands`` are
    sent (encoded) on every new connection before anything else (AUTH, SELECT, CLIENT SETNAME).
    ``while_waiting`` (a callable that must not raise), if given, runs each time commands have
    been written, while Redis runs them: the sync ``Wire``'s gap, on the event loop."""

    def __init__(self, address, setup_commands=(), timeout_s=None, connect_timeout_s=None,
                 while_waiting=None):
        self.address = address
        self.setup_commands = [hiredis.pack_command(command) for command in setup_commands]
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.while_waiting = while_waiting
        self._protocol = None
        self._connecting = None  # the future of a connection being opened

    def request(self, command):
        """Send ``command`` (encoded bytes); return an awaitable of its reply. Awaiting it
        raises redis-py's ResponseError (an error reply), ConnectionError or TimeoutError, or
        OSError. (Not a coroutine: on an open connection the reply's future itself, awaited by
        the caller without a coroutine between them.)"""
        protocol = self._protocol
        if protocol is None or protocol.closed:
            return self._request_when_connected(command)
        return protocol.send(command)

    async def _request_when_connected(self, command):
        protocol = await self._connected()
        return await protocol.send(command)

    async def _connected(self):
        """Return an open protocol; concurrent callers wait for the same connection attempt."""
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None

    async def _connect(self):
        loop = asyncio.get_running_loop()
        timeout_s = self.timeout_s

        def protocol_factory():
            return _RespProtocol(loop, timeout_s, self.while_waiting)

        if isinstance(self.address, str):
            opening = loop.create_unix_connection(protocol_factory, self.address)
        else:
            opening = loop.create_connection(protocol_factory, *self.address)
        try:
            _, protocol = await asyncio.wait_for(opening, self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError("Timeout connecting to server") from None
        try:
            replies = await asyncio.gather(*map(protocol.send, self.setup_commands),
                                           return_exceptions=True)
        except BaseException:  # cancelled
            protocol.close()
            raise
        errors = [reply for reply in replies if isinstance(reply, BaseException)]
        if errors:
            protocol.close()
            raise errors[0]
        self._protocol = protocol
        return protocol

    def close(self):
        """Close the connection (requests still waiting fail with ConnectionError)."""
        if self._protocol is not None:
            self._protocol.close()
            self._protocol = None
