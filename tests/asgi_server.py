"""A real uvicorn for the tests (tests/adapters/test_asgi.py,
tests/runtime/test_concurrency_limits.py), and a real
gunicorn with sync workers beside it (tests/config/test_reload_live.py,
tests/business/test_alerts_processes.py): started on a free 127.0.0.1 port with the environment
given (settings module, SQLite file, Redis URL), stopped by PID; and
``get``, one real HTTP request to either."""

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ratelimit_app.testing import _free_port

PROJECT_ROOT = Path(__file__).resolve().parent.parent
POLL_INTERVAL_S = 0.05


class Uvicorn:
    """``uvicorn project.asgi:application`` with ``workers`` worker processes on a free port,
    stopped by PID."""

    name = "uvicorn"

    def __init__(self, env, workdir, workers=1):
        self.env, self.workdir = env, workdir
        self.workers = workers
        self.port = _free_port()
        self.log_path = workdir / f"{self.name}.log"
        self.process = None

    def command(self):
        return [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host",
                "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers),
                "--log-level", "warning"]

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self, timeout_s=30):
        with open(self.log_path, "wb") as log:  # a file, not a pipe nobody reads
            self.process = subprocess.Popen(self.command(), cwd=PROJECT_ROOT, env=self.env,
                                            stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout_s
        while get(self, "/health/").status != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start:\n{self.log()}")
            time.sleep(POLL_INTERVAL_S)
        return self

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


class Gunicorn(Uvicorn):
    """``gunicorn project.wsgi:application`` with ``workers`` sync worker processes, stopped by
    PID."""

    name = "gunicorn"

    def __init__(self, env, workdir, workers=2):
        super().__init__(env, workdir)
        self.workers = workers

    def command(self):
        return [str(Path(sys.executable).parent / "gunicorn"), "project.wsgi:application",
                "--bind", f"127.0.0.1:{self.port}", "--workers", str(self.workers),
                "--worker-class", "sync", "--timeout", "60", "--log-level", "warning",
                # gunicorn's default control socket is one path in $HOME, shared by every server
                "--no-control-socket"]


def load_demo(env, *scripts):
    """Migrate the database ``env`` gives a server, load the demo data into it, then run each
    of ``scripts`` (Python source that sets Django up itself) with the same environment."""
    for args in (["manage.py", "migrate", "--verbosity", "0"], ["manage.py", "load_demo"],
                 *(["-c", script] for script in scripts)):
        done = subprocess.run([sys.executable, *args], cwd=PROJECT_ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr


class Answer:
    def __init__(self, status, headers, body, seconds):
        self.status, self.headers, self.body, self.seconds = status, headers, body, seconds

    def json(self):
        return json.loads(self.body)


def get(server, path, client_ip=None, headers=(), method="GET"):
    """Send one request; return an Answer (status 0 when the server could not be reached)."""
    request = urllib.request.Request(server.url(path), method=method, headers=dict(headers))
    if client_ip:
        request.add_header("X-Forwarded-For", client_ip)
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body, status, got = response.read(), response.status, response.headers
    except urllib.error.HTTPError as error:
        body, status, got = error.read(), error.code, error.headers
    except OSError:
        return Answer(0, {}, b"", time.perf_counter() - started)
    return Answer(status, got, body, time.perf_counter() - started)
