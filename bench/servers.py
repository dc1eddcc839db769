"""gunicorn servers (2 sync workers, 127.0.0.1, free port) per variant, and wrk runs against them."""

import os
import re
import socket
import subprocess
import time
import urllib.request

from .harness import ROOT

GUNICORN = str(ROOT / ".venv" / "bin" / "gunicorn")


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

    def url(self, path="/item/"):
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self, timeout_s=30):
        env = {**os.environ, "BENCH_VARIANT": self.variant,
               "DJANGO_SETTINGS_MODULE": "bench.settings"}
        self.process = subprocess.Popen(
            [GUNICORN, "project.wsgi:application", "--workers", str(self.workers),
             "--worker-class", "sync", "--bind", f"127.0.0.1:{self.port}",
             "--log-level", "warning", "--backlog", "2048"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url(), timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"gunicorn ({self.variant}) did not start")
                time.sleep(0.1)  # waiting for a server to come up

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


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
