"""bench/fixed_rate.py, the latency section's open-loop client, against a real HTTP server in a
thread: it sends on its schedule while no answer comes back, reuses kept-alive connections,
reopens ones the server closed, and counts non-2xx answers as failures."""

import http.server
import threading

import pytest

from bench.fixed_rate import run_fixed_rate

from ..helpers import poll_until


class _Server(http.server.ThreadingHTTPServer):
    """Records each request's client port; answers once ``release`` is set."""

    daemon_threads = True

    def __init__(self, *, keep_alive, status=200):
        self.release = threading.Event()
        self.ports = []
        self.status = status
        handler = type("Handler", (_Handler,), {
            "protocol_version": "HTTP/1.1" if keep_alive else "HTTP/1.0"})
        super().__init__(("127.0.0.1", 0), handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.ports.append(self.client_address[1])
        assert self.server.release.wait(30)
        body = b'{"ok": true}'
        self.send_response(self.server.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    started = []

    def start(**kwargs):
        server = _Server(**kwargs)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.release.set()
        server.shutdown()
        server.server_close()


def _run_in_thread(server, rate, seconds):
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault(
        "result", run_fixed_rate("127.0.0.1", server.server_address[1], "/x/", rate, seconds)))
    thread.start()
    return thread, outcome


def test_every_request_goes_out_on_schedule_while_no_answer_comes_back(serve):
    server = serve(keep_alive=False)
    thread, outcome = _run_in_thread(server, rate=200, seconds=0.25)
    # open loop: all 50 requests reach the server though it has answered none of them
    poll_until(lambda: len(server.ports) == 50, what="the 50 scheduled requests")
    assert "result" not in outcome  # the client waits for the answers still due
    server.release.set()
    thread.join(30)
    result = outcome["result"]
    assert (result.sent, len(result.times_ms), result.failed) == (50, 50, 0)
    assert len(result.late_ms) == 50
    # each response time runs from its own send to its answer: the first waited longest
    assert max(result.times_ms) > min(result.times_ms)


def test_kept_alive_connections_are_reused(serve):
    server = serve(keep_alive=True)
    server.release.set()
    # 50 ms apart: an answer is back before the next send even on a loaded machine (at 5 ms
    # apart every answer came after the next send there, and each send opened a connection)
    result = run_fixed_rate("127.0.0.1", server.server_address[1], "/x/", 20, 0.5)
    assert (result.sent, len(result.times_ms), result.failed) == (10, 10, 0)
    assert len(set(server.ports)) < 10  # fewer connections than requests


def test_connections_the_server_closes_are_not_reused(serve):
    server = serve(keep_alive=False)  # HTTP/1.0: the server closes after each answer
    server.release.set()
    result = run_fixed_rate("127.0.0.1", server.server_address[1], "/x/", 200, 0.1)
    assert (result.sent, len(result.times_ms), result.failed) == (20, 20, 0)
    assert len(set(server.ports)) == 20


def test_non_2xx_answers_are_failures_not_response_times(serve):
    server = serve(keep_alive=True, status=503)
    server.release.set()
    result = run_fixed_rate("127.0.0.1", server.server_address[1], "/x/", 200, 0.1)
    assert (result.sent, result.times_ms, result.failed) == (20, [], 20)


def test_a_refused_connection_is_a_failure():
    server = _Server(keep_alive=False)
    port = server.server_address[1]
    server.server_close()  # nothing listens on the port any more
    result = run_fixed_rate("127.0.0.1", port, "/x/", 100, 0.05)
    assert (result.sent, result.times_ms, result.failed) == (5, [], 5)
