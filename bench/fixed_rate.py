"""An open-loop HTTP client at a fixed request rate, for the latency section.

Request ``i`` is sent at ``start + i / rate`` whatever the server is doing: no request waits for
an earlier answer, so a slow server faces the same arrivals as a fast one and its slowness shows
in the response times instead of in fewer requests. (A closed-loop client, which sends its next
request only after the previous answer, slows down with the server; and one whose workers all
tick together, as hey's ``-q`` workers in one process do, sends its requests in bursts of one
per worker, so it measures how long a burst takes to drain, not the latency at the rate.)

Each response time runs from the moment the request's connection is opened (or an idle kept-alive
connection is taken) to its last byte. One process, one ``selectors`` loop: at the rates of the
latency section it uses a small part of a core. epoll waits in whole milliseconds, so a send can
be up to about a millisecond after its slot; how late the sends were is reported (``late_ms``)
rather than counted in the response times.
"""

import selectors
import socket
import time
from typing import NamedTuple

REQUEST_TIMEOUT_S = 10.0
MAX_IN_FLIGHT = 1024  # more open requests than this: the server has stopped, count failures


class FixedRateResult(NamedTuple):
    times_ms: list      # response time of each request that got a whole answer
    failed: int         # non-2xx answers, errors, timeouts, and sends refused for MAX_IN_FLIGHT
    sent: int           # requests the schedule asked for
    late_ms: list       # how far after its slot each request went out


class _Exchange:
    """One request on one connection, from the send to the last byte of the answer."""

    __slots__ = ("sock", "started", "reused", "received", "header_end", "body_length",
                 "closes")

    def __init__(self, sock, started, reused):
        self.sock, self.started, self.reused = sock, started, reused
        self.received = bytearray()
        self.header_end = -1    # index of the body's first byte once the head is in
        self.body_length = -1   # Content-Length; -1: until the server closes
        self.closes = True      # the server closes the connection after this answer

    def status(self):
        return int(self.received[9:12])

    def complete(self):
        """Return True once the whole answer is in (headers parsed on the way)."""
        if self.header_end < 0:
            end = self.received.find(b"\r\n\r\n")
            if end < 0:
                return False
            self.header_end = end + 4
            head = bytes(self.received[:end]).lower()
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name == b"content-length":
                    self.body_length = int(value)
            self.closes = b"\r\nconnection: close" in head or head.startswith(b"http/1.0")
        if self.body_length < 0:
            return False  # read until the server closes
        return len(self.received) - self.header_end >= self.body_length


def run_fixed_rate(host, port, path, rate, seconds):
    """Send ``rate`` requests per second for ``seconds`` to ``http://host:port/path``, evenly
    spaced; return a FixedRateResult once every answer is in (or timed out)."""
    request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
               "User-Agent: ratelimit-bench\r\n\r\n").encode()
    selector = selectors.DefaultSelector()
    idle = []            # kept-alive connections free for the next request
    in_flight = {}       # socket -> _Exchange
    times, late = [], []
    failed = 0
    total = round(rate * seconds)
    interval = 1.0 / rate
    clock = time.perf_counter
    start = clock() + 0.01
    sent = 0

    def forget(exchange):
        selector.unregister(exchange.sock)
        del in_flight[exchange.sock]

    def finish(exchange, ok):
        nonlocal failed
        forget(exchange)
        if ok and 200 <= exchange.status() < 300:
            times.append((clock() - exchange.started) * 1000)
        else:
            failed += 1
        if ok and not exchange.closes:
            idle.append(exchange.sock)
        else:
            exchange.sock.close()

    def send(started, reuse=True):
        sock = idle.pop() if reuse and idle else None
        reused = sock is not None
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            sock.connect_ex((host, port))  # EINPROGRESS: writable once connected
        exchange = _Exchange(sock, started, reused)
        in_flight[sock] = exchange
        selector.register(sock, selectors.EVENT_WRITE, exchange)

    def resend(exchange):
        """A kept-alive connection the server had closed meanwhile: the same request again on a
        new connection, timed from its first send."""
        forget(exchange)
        exchange.sock.close()
        send(exchange.started, reuse=False)

    while sent < total or in_flight:
        now = clock()
        while sent < total and start + sent * interval <= now:
            late.append((now - (start + sent * interval)) * 1000)
            sent += 1
            if len(in_flight) >= MAX_IN_FLIGHT:
                failed += 1
            else:
                send(now)
        if sent < total:
            timeout = max(0.0, start + sent * interval - clock())
        else:
            timeout = 0.05
        for key, events in selector.select(timeout):
            exchange = key.data
            sock = exchange.sock
            try:
                if events & selectors.EVENT_WRITE:
                    sock.send(request)  # a few dozen bytes: all of it, or an error
                    selector.modify(sock, selectors.EVENT_READ, exchange)
                    continue
                data = sock.recv(65536)
            except OSError:
                if exchange.reused and not exchange.received:
                    resend(exchange)
                else:
                    finish(exchange, False)
                continue
            if data:
                exchange.received += data
                if exchange.complete():
                    finish(exchange, True)
            elif exchange.reused and not exchange.received:
                resend(exchange)
            else:  # the server closed: a whole answer only if it ran to the close
                finish(exchange, exchange.header_end >= 0 and exchange.body_length < 0)
        now = clock()
        for exchange in [e for e in in_flight.values() if now - e.started > REQUEST_TIMEOUT_S]:
            finish(exchange, False)
    for sock in idle:
        sock.close()
    selector.close()
    return FixedRateResult(times, failed, sent, late)
