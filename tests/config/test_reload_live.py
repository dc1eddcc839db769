"""Edits made without a signal reach a real server process, and `manage.py ratelimit reload`
applies them at once.

Each module fixture runs a real server on its own migrated database (of the suite's kind) and
the suite's redis-server: uvicorn (project.asgi, the async path) and, for the comparison of the
rows, gunicorn too (two sync worker processes, forked: each compares in a thread of its own). The
edits are made by another Python process on that file, as a script or a data migration would;
the test polls the server with a deadline until it serves the new numbers.
"""

import os
import re
import subprocess
import sys
import time

import pytest

from ratelimit_app.decision import keys

from ..asgi_server import POLL_INTERVAL_S, PROJECT_ROOT, Gunicorn, Uvicorn, get

pytestmark = [pytest.mark.slow, pytest.mark.deployment, pytest.mark.database]

SHORT_INTERVAL_S = 2.0  # the server's CONFIG_RELOAD_INTERVAL_S, short to keep the test fast
HUGE = 1_000_000
VERSION_KEY = keys.config_version_key("rl")

SETUP = f"""
import django
django.setup()
from ratelimit_app.models import Plan, Rule
plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
Rule.objects.create(name="live-ip", plan=plan, scope="ip", endpoint="hello", rate=1,
                    period_s=60, burst={HUGE})
"""

# A queryset update: no signal, no announcement. Prints the time it committed.
UPDATE = """
import sys, time
import django
django.setup()
from ratelimit_app.models import Rule
Rule.objects.filter(name="live-ip").update(burst=int(sys.argv[1]))
print(time.time())
"""


def python(args, env):
    """Run a Python program or script in the project directory; return its stdout."""
    done = subprocess.run([sys.executable, *args], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def environment(workdir, redis_server, database_env, reload_interval_s):
    """The environment of a server on a database of its own, of the suite's kind."""
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.config.reload_settings",
            "RELOAD_INTERVAL_S": str(reload_interval_s), **database_env(workdir),
            "REDIS_URL": redis_server.url, "DJANGO_DEBUG": "0"}


def start_server(workdir, env, server_class=Uvicorn):
    python(["manage.py", "migrate", "--verbosity", "0"], env)
    python(["-c", SETUP], env)
    return server_class(env, workdir).start()


def stop_server(server):
    server.stop()
    log = server.log()
    assert "Traceback" not in log, log


@pytest.fixture(scope="module", params=[Uvicorn, Gunicorn], ids=["uvicorn", "gunicorn"])
def comparing_server(request, tmp_path_factory, redis_server, database_env):
    """A server that compares the rows every SHORT_INTERVAL_S; returns (server, env)."""
    workdir = tmp_path_factory.mktemp("reload-compare")
    env = environment(workdir, redis_server, database_env, SHORT_INTERVAL_S)
    server = start_server(workdir, env, request.param)
    yield server, env
    stop_server(server)


@pytest.fixture(scope="module")
def signal_only_server(tmp_path_factory, redis_server, database_env):
    """A server that never compares the rows (CONFIG_RELOAD_INTERVAL_S 0); returns
    (server, env)."""
    workdir = tmp_path_factory.mktemp("reload-signals")
    env = environment(workdir, redis_server, database_env, 0)
    server = start_server(workdir, env)
    yield server, env
    stop_server(server)


def served_burst(server):
    """Return the burst of the live-ip policy in the server's answer to one request."""
    answer = get(server, "/hello/")
    assert answer.status == 200
    return int(re.search(r'"live-ip";q=(\d+)', answer.headers["RateLimit-Policy"]).group(1))


def seconds_until_served(server, burst, since, timeout_s):
    """Poll the server until it serves ``burst``; return the seconds from ``since`` (a
    time.time()) to the answer that served it. Fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while served_burst(server) != burst:
        assert time.monotonic() < deadline, f"burst {burst} not served within {timeout_s} s"
        time.sleep(POLL_INTERVAL_S)
    return time.time() - since


def test_an_update_is_served_by_a_server_within_the_interval(comparing_server):
    server, env = comparing_server
    assert served_burst(server) == HUGE
    committed_at = float(python(["-c", UPDATE, "9"], env))
    took_s = seconds_until_served(server, 9, committed_at, timeout_s=SHORT_INTERVAL_S + 5)
    print(f"\nserved {took_s * 1000:.0f} ms after the update (interval {SHORT_INTERVAL_S} s)")
    # the interval, plus the time of a request or two on a busy machine
    assert took_s < SHORT_INTERVAL_S + 1.0


def test_the_reload_command_applies_at_once(signal_only_server, redis_server):
    server, env = signal_only_server
    assert served_burst(server) == HUGE
    python(["-c", UPDATE, "7"], env)
    # not announced and never compared: the server keeps its rules, whatever the wait
    for _ in range(10):
        assert served_burst(server) == HUGE
    output = python(["manage.py", "ratelimit", "reload"], env)
    done_at = time.time()
    version = redis_server.client().get(VERSION_KEY).decode()
    assert f"-> {version}: every worker reloads the quota rows within about a second." in output
    took_s = seconds_until_served(server, 7, done_at, timeout_s=5)
    print(f"\nserved {took_s * 1000:.0f} ms after `ratelimit reload` returned")
    assert took_s < 1.0


def test_migrate_announces_applied_migrations_only(tmp_path, redis_server, database_env):
    env = environment(tmp_path, redis_server, database_env, 0)
    client = redis_server.client()
    python(["manage.py", "migrate", "--verbosity", "0"], env)
    announced = client.get(VERSION_KEY)
    assert announced is not None
    python(["manage.py", "migrate", "--verbosity", "0"], env)  # nothing to apply
    assert client.get(VERSION_KEY) == announced
