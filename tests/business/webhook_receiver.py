"""A real HTTP receiver for webhook tests: an http.server on a free 127.0.0.1 port, in a thread,
recording every request it answers. ``stop()`` takes it down (the port then refuses
connections); ``start()`` brings it back on the same port.

``hold_until_in_flight=n``: the first requests are held unanswered until ``n`` are in flight at
once (or ``hold_timeout_s`` passed), then every request is answered at once. A sender posts one
delivery at a time, so ``n`` requests in flight together prove ``n`` senders sending at once;
``max_in_flight`` says how many there were."""

import http.server
import threading

from ratelimit_app.testing import _free_port


class Received:
    def __init__(self, path, headers, body):
        self.path, self.headers, self.body = path, headers, body


class Receiver:
    def __init__(self, status=200, hold_until_in_flight=0, hold_timeout_s=10):
        self.port = _free_port()
        self.status = status  # what it answers
        self.received = []
        self.hold_until_in_flight = hold_until_in_flight
        self.hold_timeout_s = hold_timeout_s
        self.max_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Condition()
        self._server = None
        self._thread = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/hooks/"

    def start(self):
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver._hold()
                receiver.received.append(Received(self.path, dict(self.headers), body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        http.server.ThreadingHTTPServer.allow_reuse_address = True
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def _hold(self):
        """Count this request in flight; while fewer than ``hold_until_in_flight`` are, wait."""
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            if self._in_flight >= self.hold_until_in_flight:
                self.hold_until_in_flight = 0  # reached once: hold nothing more
                self._lock.notify_all()
            else:
                self._lock.wait_for(lambda: self.hold_until_in_flight == 0, self.hold_timeout_s)
            self._in_flight -= 1

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None


class DribblingReceiver:
    """A raw socket server on a free 127.0.0.1 port that answers ``HTTP/1.1 200 OK`` and then one
    header line every ``interval_s``, never ending its answer, until the sender hangs up, the
    test stops it, or ``max_lines`` (bounded, so it always stops by itself). With
    ``dribble = False`` it answers a whole 200 at once. ``connections`` counts what it
    accepted."""

    def __init__(self, interval_s=0.1, max_lines=600):
        self.port = _free_port()
        self.interval_s, self.max_lines = interval_s, max_lines
        self.dribble = True
        self.connections = 0
        self._stop = threading.Event()
        self._listener = None
        self._threads = []

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/slow/"

    def start(self):
        import socket

        self._listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._listener.settimeout(0.2)
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def _accept(self):
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:  # the accept's short timeout (to see the stop), or closed
                continue
            self.connections += 1
            thread = threading.Thread(target=self._answer, args=(connection,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _answer(self, connection):
        with connection:
            connection.settimeout(5)
            try:
                request = b""
                while b"\r\n\r\n" not in request:
                    request += connection.recv(65536)
                if not self.dribble:
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    return
                connection.sendall(b"HTTP/1.1 200 OK\r\n")
                for line in range(self.max_lines):
                    if self._stop.wait(self.interval_s):
                        return
                    connection.sendall(f"X-Line-{line}: still going\r\n".encode())
            except OSError:  # the sender hung up
                return

    def stop(self):
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        for thread in self._threads:
            thread.join(5)
