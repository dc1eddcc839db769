"""The suite's database: SQLite by default, a private PostgreSQL when
RATELIMIT_TEST_DATABASE=postgresql.

``PostgresServer`` is a throw-away cluster of Debian's PostgreSQL, in the manner of
``ratelimit_app.testing.RedisServer``: initdb'd in its own temp dir, listening on a free
127.0.0.1 port (its socket in that temp dir), stopped by PID. PostgreSQL refuses to run as
root, so under root it runs as the ``postgres`` user the Debian package creates.

``SqliteDatabases`` and ``PostgresDatabases`` tell the suite which database Django uses in
process and give each subprocess the tests start (manage.py, gunicorn, uvicorn, a second worker)
an empty database of its own, through the environment project/settings.py reads.
"""

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time

from ratelimit_app.testing import HOST, _free_port

__all__ = ["PostgresServer", "SqliteDatabases", "PostgresDatabases", "databases_from_env"]

POSTGRES_ROOT = "/usr/lib/postgresql"
SUPERUSER = "postgres"
POLL_INTERVAL_S = 0.05
# A test cluster holds nothing worth a disk flush.
NO_DURABILITY = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


def postgres_bin_dir(root=POSTGRES_ROOT):
    """The newest ``/usr/lib/postgresql/<major>/bin`` holding a server; RuntimeError if none."""
    found = [path for path in glob.glob(os.path.join(root, "*", "bin"))
             if os.path.exists(os.path.join(path, "postgres"))]
    if not found:
        raise RuntimeError(f"no PostgreSQL server under {root}/<major>/bin: install Debian's "
                           f"postgresql package (apt-get install -y postgresql)")
    return max(found, key=lambda path: int(os.path.basename(os.path.dirname(path))))


class PostgresServer:
    """Start and stop a throw-away PostgreSQL cluster on 127.0.0.1 (trust authentication: it
    listens on loopback only and lives for one test session)."""

    def __init__(self, port=None, bin_dir=None):
        self.bin_dir = bin_dir or postgres_bin_dir()
        self.port = port or _free_port()
        self.workdir = tempfile.mkdtemp(prefix="ratelimit-postgres-")
        self.data_dir = os.path.join(self.workdir, "data")
        self.pid = None

    @property
    def logfile(self):
        return os.path.join(self.workdir, "postgres.log")

    def _as_owner(self, *command):
        """``command`` as the user that owns the cluster: ``postgres`` when we are root."""
        if os.geteuid() == 0:
            return ["runuser", "-u", SUPERUSER, "--", *command]
        return list(command)

    def _run(self, *command, timeout_s=120):
        done = subprocess.run(self._as_owner(*command), capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{os.path.basename(command[0])} failed: "
                               f"{(done.stderr or done.stdout).strip()}")
        return done.stdout

    def start(self, timeout_s=60):
        """Create the cluster and start the server; return once it accepts connections (on
        failure, RuntimeError naming the step, and no temp dir left behind)."""
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout_s):
        if os.geteuid() == 0:
            shutil.chown(self.workdir, SUPERUSER, SUPERUSER)
        self._run(os.path.join(self.bin_dir, "initdb"), "-D", self.data_dir, "-U", SUPERUSER,
                  "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
        options = (f"-p {self.port} -k {self.workdir} -c listen_addresses={HOST} "
                   f"{NO_DURABILITY}")
        # -w: pg_ctl returns once the server accepts connections (or failed to start)
        try:
            self._run(os.path.join(self.bin_dir, "pg_ctl"), "-D", self.data_dir, "-l",
                      self.logfile, "-o", options, "-w", "-t", str(timeout_s), "start",
                      timeout_s=timeout_s + 10)
        except RuntimeError as error:
            raise RuntimeError(f"{error} | {self._log_tail()}") from None
        with open(os.path.join(self.data_dir, "postmaster.pid")) as pid_file:
            self.pid = int(pid_file.readline())

    def _log_tail(self, lines=5):
        try:
            with open(self.logfile) as log:
                return " | ".join(log.read().splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    @property
    def running(self):
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self, timeout_s=30):
        """Stop the server by PID (SIGINT: PostgreSQL's fast shutdown), wait until it is gone,
        remove its temp dir."""
        if self.running:
            os.kill(self.pid, signal.SIGINT)
            deadline = time.monotonic() + timeout_s
            while self.running and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL_S)  # waiting for a process to exit
            if self.running:
                os.kill(self.pid, signal.SIGKILL)
        self.pid = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def django_settings(self, name=SUPERUSER):
        """The ``DATABASES`` entry for database ``name`` on this server."""
        return {"ENGINE": "django.db.backends.postgresql", "NAME": name, "USER": SUPERUSER,
                "PASSWORD": "", "HOST": HOST, "PORT": str(self.port)}

    def create_database(self, name):
        """Create the empty database ``name``; return its name."""
        self._run(os.path.join(self.bin_dir, "createdb"), "-h", HOST, "-p", str(self.port),
                  "-U", SUPERUSER, name)
        return name


class SqliteDatabases:
    """The default: Django's in-memory SQLite test database; an SQLite file per subprocess."""

    name = "sqlite"

    def configure_django(self, databases):
        pass

    def subprocess_env(self, workdir):
        """The environment giving a subprocess its own empty database (in ``workdir``)."""
        return {"SQLITE_PATH": str(workdir / "db.sqlite3")}

    def stop(self):
        pass


class PostgresDatabases:
    """A private PostgreSQL server: Django's test database and one database per subprocess."""

    name = "postgresql"

    def __init__(self):
        self.server = PostgresServer().start()
        self._created = 0

    def configure_django(self, databases):
        """Point ``databases["default"]`` (settings.DATABASES, before any test runs) at the
        server. Updated in place, since Django's connection handler holds that dict; the SQLite
        wrapper that django.setup() made (model classes ask it for name lengths) is dropped,
        unused, so the next access makes a PostgreSQL one."""
        from django.db import connections

        databases["default"].update(self.server.django_settings())
        del connections["default"]

    def subprocess_env(self, workdir):
        """The environment (project/settings.py's POSTGRES_* variables) giving a subprocess an
        empty database of its own."""
        self._created += 1
        name = self.server.create_database(f"subprocess_{self._created}")
        return {"POSTGRES_DB": name, "POSTGRES_HOST": HOST, "POSTGRES_PORT": str(self.server.port),
                "POSTGRES_USER": SUPERUSER}

    def stop(self):
        self.server.stop()


def databases_from_env(environ=os.environ):
    """The databases RATELIMIT_TEST_DATABASE asks for (``sqlite``, the default, or
    ``postgresql``); ValueError for anything else."""
    wanted = environ.get("RATELIMIT_TEST_DATABASE", "sqlite")
    if wanted == "postgresql":
        return PostgresDatabases()
    if wanted == "sqlite":
        return SqliteDatabases()
    raise ValueError(f"RATELIMIT_TEST_DATABASE={wanted!r}: expected 'sqlite' or 'postgresql'")
