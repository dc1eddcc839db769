"""``make run`` for real: it serves, and Ctrl-C stops the server and its private Redis cleanly.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group (make, the script,
redis-server, the server); the test does the same with ``killpg`` on a group of its own.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/make"), reason="needs make")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_serving(url, process, deadline_s):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except urllib.error.HTTPError:
            return True  # an HTTP answer (even 429) means it serves
        except OSError:
            time.sleep(0.1)  # polling a real server with a deadline
    return False


def is_running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Demo:
    """``argv`` (``make run`` or the script) started in a process group of its own, with its own
    port, SQLite file and TMPDIR (where the private Redis makes its temp dir)."""

    def __init__(self, tmp_path, argv):
        self.port = free_port()
        self.temp_dir = tmp_path / "tmp"
        self.temp_dir.mkdir()
        self.log_path = tmp_path / "demo.log"
        env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
        env.update(PORT=str(self.port), TMPDIR=str(self.temp_dir),
                   SQLITE_PATH=str(tmp_path / "demo.sqlite3"),
                   PY=sys.executable)  # this cell's interpreter (make run uses .venv's)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def log(self):
        return self.log_path.read_text()

    def wait_until_serving(self):
        assert wait_until_serving(f"http://127.0.0.1:{self.port}/hello/", self.process, 90), \
            self.log
        return int(re.search(r"redis-server \(pid (\d+)\)", self.log).group(1))

    def kill_leftovers(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def assert_all_stopped(self, redis_pid):
        assert list(self.temp_dir.iterdir()) == []  # the private Redis's temp dir is gone
        assert not is_running(redis_pid)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()


def test_ctrl_c_stops_make_run_cleanly(tmp_path):
    demo = Demo(tmp_path, ["make", "--no-print-directory", "run"])
    try:
        redis_pid = demo.wait_until_serving()
        assert "X-Api-Key: rk_alice_free" in demo.log  # the demo credentials are printed
        redis_dir = Path(re.search(r"data dir (\S+)", demo.log).group(1))
        assert redis_dir.parent == demo.temp_dir and redis_dir.is_dir()
        os.killpg(demo.process.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        demo.process.wait(30)
    finally:
        demo.kill_leftovers()
    # GNU make re-raises a SIGINT it received itself once its recipe has finished, so make's
    # own status is "interrupted" (the shell shows 130 and prints nothing); what it must not
    # do is report a failed recipe ("make: *** [...] Error 1" / "Interrupt").
    assert demo.process.returncode in (0, -signal.SIGINT), demo.log
    assert "***" not in demo.log and "Traceback" not in demo.log, demo.log
    assert "Demo stopped." in demo.log
    demo.assert_all_stopped(redis_pid)


def test_the_script_itself_exits_0_when_stopped(tmp_path):
    """The recipe's own status (what make reports as "Error N" when it is not 0), with
    SIGTERM sent to the script alone: it must stop the server and Redis by their PIDs."""
    demo = Demo(tmp_path, [str(ROOT / "scripts" / "run-demo.sh")])
    try:
        redis_pid = demo.wait_until_serving()
        demo.process.send_signal(signal.SIGTERM)  # to the script only, not its group
        assert demo.process.wait(30) == 0, demo.log
    finally:
        demo.kill_leftovers()
    demo.assert_all_stopped(redis_pid)
