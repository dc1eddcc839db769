"""Alerts and webhooks across processes: a real gunicorn (4 sync worker processes) serving one
client over its calendar quota's thresholds, each worker storing what it saw from its own
background thread into one SQLite file, then ``manage.py ratelimit deliver`` as its own process
sending to a real receiver, stopped and started again (a sender restart sends nothing twice).
"""

import concurrent.futures
import hashlib
import hmac
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ratelimit_app.testing import _free_port

from .webhook_receiver import Receiver

ROOT = Path(__file__).resolve().parent.parent
GUNICORN = str(ROOT / ".venv" / "bin" / "gunicorn")
QUOTA = 40
THRESHOLDS = (25, 50, 100)

SETUP = f"""
import django
django.setup()
import sys
from ratelimit_app.alert_models import WebhookEndpoint
from ratelimit_app.models import Rule
Rule.objects.create(name="daily", scope="ip", kind="calendar", calendar_period="day",
                    rate={QUOTA}, period_s=86400, burst={QUOTA},
                    alert_thresholds="{','.join(map(str, THRESHOLDS))}")
WebhookEndpoint.objects.create(name="receiver", url=sys.argv[1])
"""


def get(port, path, client_ip):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"X-Forwarded-For": client_ip})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def poll(condition, what, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # deadline poll


@pytest.fixture(scope="module")
def receiver():
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory, redis_server, receiver):
    workdir = tmp_path_factory.mktemp("alerts")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings",
           "SQLITE_PATH": str(workdir / "db.sqlite3"), "REDIS_URL": redis_server.url,
           "DEMO_BEHIND_PROXY": "1", "DJANGO_DEBUG": "0"}
    for args in (["manage.py", "migrate", "--verbosity", "0"], ["-c", SETUP, receiver.url]):
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
    port = _free_port()
    log = open(workdir / "gunicorn.log", "wb")
    process = subprocess.Popen(
        [GUNICORN, "project.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "4",
         "--worker-class", "sync", "--timeout", "60", "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        poll(lambda: _up(port, process), "gunicorn")
        yield port, env, workdir / "db.sqlite3"
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def _up(port, process):
    assert process.poll() is None, "gunicorn exited"
    try:
        return get(port, "/health/", "10.0.0.1") == 200
    except OSError:
        return False


def rows(db, sql):
    connection = sqlite3.connect(db, timeout=10)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def deliver(env, *args):
    return subprocess.Popen([sys.executable, "manage.py", "ratelimit", "deliver", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_one_alert_and_one_delivery_per_crossing_under_concurrent_traffic(site, receiver):
    port, env, db = site
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(lambda _: get(port, "/hello/", "10.7.0.1"), range(QUOTA + 20)))
    assert codes.count(200) == QUOTA and codes.count(429) == 20

    poll(lambda: len(rows(db, "SELECT id FROM ratelimit_app_quotaalert")) >= len(THRESHOLDS),
         "the workers to store the alerts")
    alerts = rows(db, "SELECT threshold, used, \"limit\" FROM ratelimit_app_quotaalert "
                      "ORDER BY threshold")
    assert alerts == [(t, QUOTA * t // 100, QUOTA) for t in THRESHOLDS]
    assert len(rows(db, "SELECT id FROM ratelimit_app_webhookdelivery")) == len(THRESHOLDS)

    # the sender, as its own long-running process; stopped by SIGTERM once it has sent them
    sender = deliver(env)
    try:
        poll(lambda: len(receiver.received) >= len(THRESHOLDS), "the deliveries")
    finally:
        sender.send_signal(signal.SIGTERM)
        out, err = sender.communicate(timeout=20)
    assert sender.returncode == 0, err
    assert "Webhook sender stopped." in out

    # a restarted sender finds nothing left to send
    again = deliver(env, "--once")
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert out.startswith("0 deliveries sent")
    assert len(receiver.received) == len(THRESHOLDS)

    (secret,), = rows(db, "SELECT secret FROM ratelimit_app_webhookendpoint")
    thresholds = []
    for got in receiver.received:
        fields = dict(p.split("=", 1) for p in got.headers["X-Ratelimit-Signature"].split(","))
        expected = hmac.new(secret.encode(), f"{fields['t']}.".encode() + got.body,
                            hashlib.sha256).hexdigest()
        assert hmac.compare_digest(expected, fields["v1"])
        thresholds.append(json.loads(got.body)["data"]["threshold_percent"])
    assert sorted(thresholds) == list(THRESHOLDS)  # one delivery per crossing
    assert set(rows(db, "SELECT status, attempts FROM ratelimit_app_webhookdelivery")) == \
        {("sent", 1)}


RACE = """
import django
django.setup()
from ratelimit_app.alert_models import QuotaAlert
from ratelimit_app.alerts import Crossing, quota_threshold_crossed, store_crossings
from ratelimit_app.models import Rule
signals = []
quota_threshold_crossed.connect(lambda sender, alert, **kw: signals.append(alert.pk), weak=False)
rule = Rule.objects.get(name="daily")
stored = store_crossings([Crossing(rule.id, "rl:{ip.race}", "ip:10.8.0.1", 90,
                                   1_700_000_000_000, 36, 40)])
print(len(stored), len(signals))
"""


def test_processes_storing_the_same_crossing_at_once_store_one_row_and_send_one_signal(site):
    port, env, db = site
    racers = [subprocess.Popen([sys.executable, "-c", RACE], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(4)]
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        outcomes.append(tuple(map(int, out.split())))
    assert sorted(outcomes) == [(0, 0), (0, 0), (0, 0), (1, 1)]
    assert rows(db, "SELECT COUNT(*) FROM ratelimit_app_quotaalert WHERE threshold = 90") == \
        [(1,)]
    assert rows(db, "SELECT COUNT(*) FROM ratelimit_app_webhookdelivery d JOIN "
                    "ratelimit_app_quotaalert a ON d.alert_id = a.id WHERE a.threshold = 90") == \
        [(1,)]


AT_EXIT = """
import django
django.setup()
from ratelimit_app.alerts import AlertQueue, Crossing
from ratelimit_app.conf import get_config
from ratelimit_app.models import Rule
rule = Rule.objects.get(name="daily")
# no thread: only the exit stores what is queued
queue = AlertQueue(lambda: 0, get_config, autostart=False, drain_at_exit=True)
queue.put([Crossing(rule.id, "rl:{ip.exit}", "ip:10.9.0.1", 75, 1_700_000_000_000, 30, 40)])
print(queue.pending())
"""


def test_a_worker_stopping_stores_the_crossings_it_still_holds(site):
    port, env, db = site
    done = subprocess.run([sys.executable, "-c", AT_EXIT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1\n"  # queued when the script ended
    assert rows(db, "SELECT identity_key, threshold FROM ratelimit_app_quotaalert "
                    "WHERE threshold = 75") == [("rl:{ip.exit}", 75)]
