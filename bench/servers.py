"""gunicorn servers (2 sync workers, 127.0.0.1, free port) per variant, a uvicorn (ASGI) one, and
wrk runs against them."""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from .harness import ROOT

# the virtualenv running the bench (or the test suite's cell)
GUNICORN = str(Path(sys.executable).parent / "gunicorn")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gunicorn:
    """One gunicorn serving bench/urls.py with the throttle of ``variant``."""

    def __init__(self, variant, workers=2):
        self.variant, self.workers = variant, workers
        self.port = _free_port()
        self.process = None
        self.workdir = None  # its own temp dir, for its log (removed by stop)

    def url(self, path="/item/"):
        return f"http://127.0.0.1:{self.port}{path}"

    def command(self):
        return [GUNICORN, "project.wsgi:application", "--workers", str(self.workers),
                "--worker-class", "sync", "--bind", f"127.0.0.1:{self.port}",
                "--log-level", "warning", "--backlog", "2048",
                # gunicorn's default control socket is one path in $HOME: two servers (or
                # two bench runs) would fight over it, and the bench never uses it
                "--no-control-socket"]

    def start(self, timeout_s=30):
        env = {**os.environ, "BENCH_VARIANT": self.variant,
               "DJANGO_SETTINGS_MODULE": "bench.settings", **self.extra_env}
        self.workdir = tempfile.mkdtemp(prefix=f"bench-gunicorn-{self.variant}-")
        log_path = os.path.join(self.workdir, "gunicorn.log")
        # a log file, not a pipe nobody reads (a full pipe would block the server)
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url(), timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    with open(log_path, errors="replace") as log:
                        tail = log.read()[-2000:]
                    self.stop()
                    raise RuntimeError(f"{type(self).__name__} ({self.variant}) did not "
                                       f"start:\n{tail}")
                time.sleep(0.1)  # waiting for a server to come up

    extra_env = {}

    def worker_pids(self):
        """Return the PIDs of this server's worker processes (the master's children)."""
        pid = self.process.pid
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(child) for child in children.read().split()]

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


class Uvicorn(Gunicorn):
    """uvicorn serving project.asgi with the throttle of ``variant``: QuotaMiddleware runs in
    async mode and, with MIDDLEWARE_INCLUDES_DRF, decides on the event loop (asyncio Redis
    client); the DRF view runs in a thread, as Django runs sync views under ASGI."""

    extra_env = {"BENCH_MIDDLEWARE_DECIDES": "1"}

    def command(self):
        # uvicorn workers on a socket each, with TCP_NODELAY (bench/asgi_server.py says why)
        return [sys.executable, "-m", "bench.asgi_server", "project.asgi:application",
                "--workers", str(self.workers), "--host", "127.0.0.1", "--port", str(self.port)]


def cpu_seconds(pid):
    """Return the CPU seconds (user + system) process ``pid`` has used, 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url, seconds, connections=32, threads=2):
    """Run wrk; return {"rps": requests/s, "requests": n, "non_2xx": n, "seconds": s}."""
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "5s", url],
        capture_output=True, text=True, timeout=seconds + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "requests": total, "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
            "socket_errors": errors.group(1) if errors else "", "seconds": seconds}


def start_all(variants):
    """Start one server per variant (stopping those already started if one fails)."""
    servers = {}
    try:
        for variant in variants:
            servers[variant] = Gunicorn(variant).start()
    except Exception:
        stop_all(servers)
        raise
    return servers


def stop_all(servers):
    for server in servers.values():
        server.stop()
