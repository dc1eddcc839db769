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
