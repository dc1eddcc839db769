"""Alerts and webhooks across processes: a real gunicorn (4 sync worker processes) serving one
client over its calendar quota's thresholds, each worker storing what it saw from its own
background thread into one database (an SQLite file, or PostgreSQL in that cell: the
``database_env`` fixture), then ``manage.py ratelimit deliver`` as its own process sending to a
real receiver, stopped and started again (a sender restart sends nothing twice); two senders at
once sharing one outbox.

The rows are read through Django in a process on the same database (``read``), so the assertions
hold on either database.
"""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from ratelimit_app.business.alerts.models import TOP_CALLERS_KEPT

from ..asgi_server import Gunicorn
from ..helpers import poll_until
from .webhook_receiver import Receiver

ROOT = Path(__file__).resolve().parents[2]
QUOTA = 40
THRESHOLDS = (25, 50, 100)

SETUP = f"""
import django
django.setup()
import sys
from ratelimit_app.business.alerts.models import WebhookEndpoint
from ratelimit_app.models import Rule
Rule.objects.create(name="daily", scope="ip", kind="calendar", calendar_period="day",
                    rate={QUOTA}, period_s=86400, burst={QUOTA},
                    alert_thresholds="{','.join(map(str, THRESHOLDS))}")
WebhookEndpoint.objects.create(name="receiver", url=sys.argv[1])
"""

READ = """
import django
django.setup()
import json, sys
from ratelimit_app.business.alerts.models import QuotaAlert, WebhookDelivery, WebhookEndpoint
print(json.dumps(eval(sys.argv[1])))
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
    """``poll_until`` with the longer deadline processes started here may need."""
    poll_until(condition, timeout_s, what)


@pytest.fixture(scope="module")
def receiver():
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def site(tmp_path_factory, redis_server, receiver, database_env):
    workdir = tmp_path_factory.mktemp("alerts")
    env = migrated_env(workdir, redis_server, database_env)
    python(env, "-c", SETUP, receiver.url)
    server = Gunicorn(env, workdir, workers=4).start()
    try:
        yield server.port, env
    finally:
        server.stop()


def python(env, *args):
    """Run ``python *args`` in the project with ``env``; return its stdout."""
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def migrated_env(workdir, redis_server, database_env):
    """The environment of the demo project on a migrated database of its own."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **database_env(workdir),
           "REDIS_URL": redis_server.url, "DEMO_BEHIND_PROXY": "1", "DJANGO_DEBUG": "0",
           # the deliveries of the client-IP rule's alerts due at once (test_alerts.py tests the
           # wait on the clock seam)
           "DEMO_ALERTS_AGGREGATE_S": "0"}
    python(env, "manage.py", "migrate", "--verbosity", "0")
    return env


def read(env, expression):
    """Return the value (through JSON: tuples become lists) of ``expression``, an ORM query over
    the alert models, evaluated by Django in a process on ``env``'s database."""
    return json.loads(python(env, "-c", READ, expression))


def deliver(env, *args):
    return subprocess.Popen([sys.executable, "manage.py", "ratelimit", "deliver", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_one_alert_and_one_delivery_per_crossing_under_concurrent_traffic(site, receiver):
    port, env = site
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(lambda _: get(port, "/hello/", "10.7.0.1"), range(QUOTA + 20)))
    assert codes.count(200) == QUOTA and codes.count(429) == 20

    poll(lambda: read(env, "QuotaAlert.objects.count()") >= len(THRESHOLDS),
         "the workers to store the alerts", timeout_s=60)
    alerts = read(env, "list(QuotaAlert.objects.order_by('threshold')"
                       ".values_list('threshold', 'used', 'limit'))")
    assert alerts == [[t, QUOTA * t // 100, QUOTA] for t in THRESHOLDS]
    assert read(env, "WebhookDelivery.objects.count()") == len(THRESHOLDS)

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

    secret = read(env, "WebhookEndpoint.objects.get(name='receiver').secret")
    thresholds = []
    for got in receiver.received:  # what a receiver checks, with the standardwebhooks package
        alert = Webhook(secret).verify(got.body, got.headers)
        thresholds.append(alert["data"]["threshold_percent"])
    assert sorted(thresholds) == list(THRESHOLDS)  # one delivery per crossing
    assert read(env, "sorted(set(WebhookDelivery.objects.values_list('status', 'attempts')))") \
        == [["sent", 1]]


RACE = """
import django
django.setup()
from ratelimit_app.business.alerts.models import QuotaAlert
from ratelimit_app.business.alerts.crossings import (Crossing, quota_threshold_crossed,
                                                     store_crossings)
from ratelimit_app.models import Rule
signals = []
quota_threshold_crossed.connect(lambda sender, alert, **kw: signals.append(alert.pk), weak=False)
rule = Rule.objects.get(name="daily")
stored = store_crossings([Crossing(rule.id, "rl:{ip.race}", "ip:10.8.0.1", 90,
                                   1_700_000_000_000, 36, 40)])
print(len(stored), len(signals))
"""


def test_processes_storing_the_same_crossing_at_once_store_one_row_and_send_one_signal(site):
    port, env = site
    racers = [subprocess.Popen([sys.executable, "-c", RACE], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(4)]
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        outcomes.append(tuple(map(int, out.split())))
    assert sorted(outcomes) == [(0, 0), (0, 0), (0, 0), (1, 1)]
    assert read(env, "QuotaAlert.objects.filter(threshold=90).count()") == 1
    assert read(env, "WebhookDelivery.objects.filter(alert__threshold=90).count()") == 1


RACERS = 12
AGGREGATE_RACE = """
import django
django.setup()
import sys
from ratelimit_app.business.alerts.crossings import Crossing, store_crossings
from ratelimit_app.models import Rule
rule = Rule.objects.get(name="daily")
n = int(sys.argv[1])
stored = store_crossings([Crossing(rule.id, f"rl:{{ip.racer{n}}}", f"ip:10.8.1.{n}", 95,
                                   1_700_000_000_000, 38, 40, True)])
print(len(stored))
"""


def test_processes_adding_addresses_to_one_aggregated_alert_at_once_count_each(site):
    port, env = site
    # enough racers that, on SQLite, a read turning into a write beside another's would fail
    racers = [subprocess.Popen([sys.executable, "-c", AGGREGATE_RACE, str(n)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for n in range(RACERS)]
    made = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        made.append(int(out))
    assert sorted(made) == [0] * (RACERS - 1) + [1]  # one made the row, the others added to it
    assert read(env, "list(QuotaAlert.objects.filter(threshold=95)"
                     ".values_list('callers', flat=True))") == [RACERS]
    assert read(env, "len(QuotaAlert.objects.get(threshold=95).top_callers)") == TOP_CALLERS_KEPT
    body = read(env, "WebhookDelivery.objects.get(alert__threshold=95).body")
    assert json.loads(body)["data"]["callers"] == RACERS  # rewritten by each, not yet sent


AT_EXIT = """
import django
django.setup()
from ratelimit_app.business.alerts.crossings import AlertQueue, Crossing
from ratelimit_app.conf import get_config
from ratelimit_app.models import Rule
rule = Rule.objects.get(name="daily")
# no thread: only the exit stores what is queued
queue = AlertQueue(lambda: 0, get_config, autostart=False, drain_at_exit=True)
queue.put([Crossing(rule.id, "rl:{ip.exit}", "ip:10.9.0.1", 75, 1_700_000_000_000, 30, 40)])
print(queue.pending())
"""


def test_a_worker_stopping_stores_the_crossings_it_still_holds(site):
    port, env = site
    done = subprocess.run([sys.executable, "-c", AT_EXIT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1\n"  # queued when the script ended
    assert read(env, "list(QuotaAlert.objects.filter(threshold=75)"
                     ".values_list('identity_key', 'threshold'))") == [["rl:{ip.exit}", 75]]


# --- two senders sharing one outbox ----------------------------------------------------------

OUTBOX = """
import django
django.setup()
import sys
from ratelimit_app.business.alerts.models import WebhookDelivery, WebhookEndpoint
from ratelimit_app.business.alerts.webhooks import first_attempt_times
endpoint = WebhookEndpoint.objects.create(name="shared", url=sys.argv[1])
next_at, give_up_at = first_attempt_times()
WebhookDelivery.objects.bulk_create(
    WebhookDelivery(endpoint=endpoint, event="quota.threshold_crossed", body=f'{{"n":{n}}}',
                    next_attempt_at=next_at, give_up_at=give_up_at)
    for n in range(int(sys.argv[2])))
"""

SENDER = """
import django
django.setup()
from django.conf import settings
from django.core.management import call_command
# the receiver holds the first post until the other sender posts too: wait for it
settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "WEBHOOK_TIMEOUT_S": 90}
call_command("ratelimit", "deliver", "--once")
"""
OUTBOX_SIZE = 40  # two of the sender's batches


@pytest.fixture
def holding_receiver():
    receiver = Receiver(hold_until_in_flight=2, hold_timeout_s=60).start()
    yield receiver
    receiver.stop()


def test_two_senders_at_once_claim_disjoint_deliveries_and_send_each_once(
        tmp_path, redis_server, database_env, holding_receiver):
    env = migrated_env(tmp_path, redis_server, database_env)
    python(env, "-c", OUTBOX, holding_receiver.url, str(OUTBOX_SIZE))

    def start_sender():
        return subprocess.Popen([sys.executable, "-c", SENDER], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # the first sender claims a batch and posts its first delivery, held by the receiver; the
    # second then claims while the first's rows are taken, and posts too: two in flight at once
    first = start_sender()
    poll(lambda: holding_receiver.max_in_flight >= 1 or first.poll() is not None,
         "the first sender's post", timeout_s=60)
    second = start_sender()
    sent = []
    for sender in (first, second):
        out, err = sender.communicate(timeout=120)
        assert sender.returncode == 0, err
        sent.append(int(out.split()[0]))  # "N deliveries sent, ..."

    assert holding_receiver.max_in_flight == 2  # both were sending at the same time
    assert all(sent) and sum(sent) == OUTBOX_SIZE
    ids = [int(got.headers["webhook-id"]) for got in holding_receiver.received]
    assert len(ids) == len(set(ids)) == OUTBOX_SIZE  # each delivery posted exactly once
    assert read(env, "sorted(WebhookDelivery.objects.values_list('id', flat=True))") == \
        sorted(ids)
    assert read(env, "sorted(set(WebhookDelivery.objects.values_list('status', 'attempts')))") \
        == [["sent", 1]]
