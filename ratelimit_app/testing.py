"""Test and benchmark helpers: a private ``redis-server`` on a free loopback port.

Used by this app's suite and benchmarks; projects using the app may use it in theirs.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import redis

__all__ = ["RedisServer"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """Start, stop, kill and restart a throw-away redis-server listening on 127.0.0.1 only."""

    def __init__(self, port=None, executable=None):
        self.executable = executable or shutil.which("redis-server") or "/usr/bin/redis-server"
        self.port = port or _free_port()
        self.workdir = tempfile.mkdtemp(prefix="ratelimit-redis-")
        self.process = None

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self, timeout_s=10):
        """Start the server and return once it answers PING."""
        if not os.path.exists(self.executable):
            raise RuntimeError("redis-server not found: apt-get install -y redis-server")
        self.process = subprocess.Popen(
            [self.executable, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.workdir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                # another test run may have grabbed the same free port first: make sure the
                # server answering is ours
                if self.client().info("server")["process_id"] == self.process.pid:
                    return self
                raise RuntimeError(f"port {self.port} is served by another redis-server")
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)  # waiting for a process to come up, not for test timing

    def stop(self):
        """Stop the server (SIGTERM) and wait for it to exit."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def kill(self):
        """Kill the server abruptly (SIGKILL), as a crash would."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self):
        self.kill()
        return self.start()

    def assert_empty(self):
        """Refuse to run against a Redis that already holds data."""
        size = self.client().dbsize()
        if size:
            raise RuntimeError(f"Redis on port {self.port} already holds {size} keys; refusing.")

    def command_calls(self, command):
        """Return how many times the server executed ``command`` (from INFO commandstats)."""
        stats = self.client().info("commandstats")
        return stats.get(f"cmdstat_{command.lower()}", {}).get("calls", 0)
