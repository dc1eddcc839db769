"""The lists in a real gunicorn with three sync workers, edited by another process: an entry binds
every worker, an IPv6 deny range refuses the callers it holds, an exempt allow passes without
headers, and an entry's end frees its callers on every worker at the moment (no request after it
refused, none before it let through).

The server runs on its own migrated database and the suite's redis-server, behind a trusted
proxy (the client address comes in X-Forwarded-For); each response says which worker decided
it (EXPOSE_CONFIG_VERSION)."""

import os
import time

import pytest

from ..asgi_server import POLL_INTERVAL_S, Gunicorn, get
from ..config.test_reload_live import python, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.deployment, pytest.mark.database]

WORKERS = 3
SETUP = """
import django
django.setup()
from ratelimit_app.models import Plan, Rule
plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
Rule.objects.create(name="per-ip", plan=plan, scope="ip", rate=1000, period_s=1, burst=1000)
"""
# an edit made by another process, as an admin save in another worker would be; prints the
# time it committed
ADD = """
import sys, time
from datetime import datetime, timedelta, timezone
import django
django.setup()
from ratelimit_app.models import AccessListEntry
kind, value, reason, exempt, ends_in_s = sys.argv[1:6]
ends_at = None if ends_in_s == "-" else \\
    datetime.now(timezone.utc) + timedelta(seconds=float(ends_in_s))
AccessListEntry.objects.create(kind=kind, target="ip", value=value, reason=reason,
                               exempt=exempt == "1", ends_at=ends_at)
print(time.time() if ends_at is None else ends_at.timestamp())
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis_server, database_env):
    workdir = tmp_path_factory.mktemp("lists-gunicorn")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.config.propagation_settings",
           "RELOAD_INTERVAL_S": "30", "DEMO_BEHIND_PROXY": "1", **database_env(workdir),
           "REDIS_URL": redis_server.url, "DJANGO_DEBUG": "0"}
    python(["manage.py", "migrate", "--verbosity", "0"], env)
    python(["-c", SETUP], env)
    server = Gunicorn(env, workdir, workers=WORKERS).start()
    server.env = env
    yield server
    stop_server(server)


def add(server, kind, value, reason, *, exempt=False, ends_in_s=None):
    out = python(["-c", ADD, kind, value, reason, "1" if exempt else "0",
                  "-" if ends_in_s is None else str(ends_in_s)], server.env)
    return float(out)


def until_status(server, client_ip, status, timeout_s=15):
    deadline = time.monotonic() + timeout_s
    while get(server, "/hello/", client_ip).status != status:
        assert time.monotonic() < deadline, f"{client_ip} not answered {status} in {timeout_s} s"
        time.sleep(POLL_INTERVAL_S)


def answers(server, client_ip, count):
    return [get(server, "/hello/", client_ip) for _ in range(count)]


def answers_of_every_worker(server, client_ip, count, timeout_s=30):
    """Return ``count`` answers, and more until every worker has given one: which worker
    accepts a connection is the kernel's choice, and a loaded machine can leave one of them
    without any of ``count`` requests."""
    got = answers(server, client_ip, count)
    deadline = time.monotonic() + timeout_s
    while len({answer.headers.get("RateLimit-Worker") for answer in got}) < WORKERS:
        assert time.monotonic() < deadline, f"a worker answered none of {len(got)} requests"
        got.append(get(server, "/hello/", client_ip))
    return got


def test_an_entry_binds_every_worker_and_an_ipv6_range_refuses(server):
    assert get(server, "/hello/", "2001:db8:0:5::9").status == 200
    add(server, "deny", "2001:db8::/48", "v6 abuse")
    until_status(server, "2001:db8:0:5::9", 403)
    refused = answers_of_every_worker(server, "2001:db8:0:ffff::1", 60)
    assert {answer.status for answer in refused} == {403}  # every worker's answers among them
    assert {answer.json()["reason"] for answer in refused} == {"v6 abuse"}
    assert not any(answer.headers.get("RateLimit") for answer in refused)
    assert {answer.status for answer in answers(server, "2001:db8:1::1", 20)} == {200}

    add(server, "allow", "198.51.100.0/24", "monitoring", exempt=True)
    until_status(server, "198.51.100.7", 200)
    exempt = answers(server, "198.51.100.7", 30)
    assert {answer.status for answer in exempt} == {200}
    assert not any(answer.headers.get("RateLimit-Policy") for answer in exempt)
    assert all(answer.headers.get("RateLimit-Policy") for answer in
               answers(server, "192.0.2.7", 5))  # a caller outside it is limited


def test_an_entry_ends_at_its_moment_on_every_worker(server):
    client = "203.0.113.77"
    ends_at = add(server, "deny", client, "cool off", ends_in_s=3)
    until_status(server, client, 403)
    records = []
    while time.time() < ends_at + 1:
        started = time.time()
        answer = get(server, "/hello/", client)
        records.append((started, time.time(), answer.status, answer.headers["RateLimit-Worker"]))
    before = [status for started, ended, status, _ in records if ended < ends_at]
    after = [status for started, ended, status, _ in records if started >= ends_at]
    assert before and set(before) == {403}
    assert after and set(after) == {200}
    assert len({worker for *_, worker in records}) == WORKERS
