"""Usage records for billing: counted by the metrics recorder, flushed to Redis with the
metrics, rolled up into UsageRecord rows exactly once (metrics/usage.py,
business/usage/rollup.py), read back per day and per month (business/usage/records.py)."""

import datetime
import json
import os
import select
import signal
import subprocess
import sys
import zoneinfo
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from ratelimit_app.business.usage.records import MONTH, usage_rows
from ratelimit_app.business.usage.rollup import UsageRollup
from ratelimit_app.metrics import fields
from ratelimit_app.models import RollupBatch, Rule, UsageRecord

from ..helpers import api_key, create_usage_records, limiter, use_fake_clock
from .reply_dropping_proxy import ReplyDroppingProxy

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def berlin_ms(*when):
    """Milliseconds since the epoch of a Berlin wall-clock time (year, month, day, ...)."""
    return int(datetime.datetime(*when, tzinfo=BERLIN).timestamp() * 1000)


@pytest.fixture
def in_berlin(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CALENDAR_TIME_ZONE": "Europe/Berlin"}


def test_the_day_of_a_decision_is_the_calendar_day_in_the_time_zone():
    from ratelimit_app.metrics.usage import DayClock

    days = DayClock(lambda: "Europe/Berlin")
    midnight_s = berlin_ms(2026, 3, 10) / 1000
    assert days.day_of(midnight_s - 0.001) == "2026-03-09"  # 22:59:59.999 UTC
    assert days.day_of(midnight_s) == "2026-03-10"
    assert days.day_of(midnight_s - 1) == "2026-03-09"  # an earlier time looked up again
    # the 23-hour day of the switch to summer time ends at its real midnight
    assert days.day_of(berlin_ms(2026, 3, 29, 23, 59, 59) / 1000) == "2026-03-29"
    assert days.day_of(berlin_ms(2026, 3, 30) / 1000) == "2026-03-30"


def billing_rules():
    """A calendar quota of 10 units a day per key or user, and a roomy tenant bucket."""
    for fields_ in ({"name": "daily-units", "scope": "user", "kind": "calendar",
                     "calendar_period": "day", "rate": 10},
                    {"name": "tenant-rate", "scope": "tenant", "rate": 1000, "period_s": 3600,
                     "burst": 1000}):
        rule = Rule(**fields_)
        rule.full_clean()
        rule.save()


def call(raw_key, cost):
    """One request of ``cost`` units with ``raw_key``; returns the status code."""
    return Client().get("/hello/", HTTP_X_API_KEY=raw_key,
                        HTTP_X_REQUEST_COST=str(cost)).status_code


def flush_and_roll_up():
    limiter().flusher.flush_now()
    return UsageRollup(limiter().store.metrics_client()).run()


def usage_keys_left(redis_client):
    """The usage keys in Redis but the flushers' markers (usage_batches.py)."""
    return [k for k in redis_client.keys("*{usage}*") if b":added:" not in k]


def records():
    """``{(day text, identity, tenant, rule): (units, allowed, refused)}`` of every record."""
    return {(r.day.isoformat(), r.identity, r.tenant, r.rule): (r.units, r.allowed, r.refused)
            for r in UsageRecord.objects.all()}


@pytest.mark.django_db
def test_records_equal_what_the_buckets_charged_across_midnight(in_berlin):
    billing_rules()
    acme, acme_raw = api_key("ann", "acme")
    clock = use_fake_clock(now_ms=berlin_ms(2026, 3, 9, 23, 59))
    # 10 units a day: 3 + 3 + 3 allowed, 3 refused (1 left), 1 allowed, 1 refused
    assert [call(acme_raw, cost) for cost in (3, 3, 3, 3, 1, 1)] == \
        [200, 200, 200, 429, 200, 429]
    clock.now_ms = berlin_ms(2026, 3, 10)  # midnight in Berlin: a new day, a new quota
    assert [call(acme_raw, cost) for cost in (4, 4, 4)] == [200, 200, 429]

    result = flush_and_roll_up()
    assert result.batches == 1 and result.records == 4
    key = f"key:{acme.id}"
    assert records() == {
        ("2026-03-09", key, "acme", "daily-units"): (10, 4, 2),
        ("2026-03-09", key, "acme", "tenant-rate"): (10, 4, 2),
        ("2026-03-10", key, "acme", "daily-units"): (8, 2, 1),
        ("2026-03-10", key, "acme", "tenant-rate"): (8, 2, 1),
    }
    assert UsageRecord.objects.get(day="2026-03-10", rule="daily-units").display.startswith(
        "key rk_")
    month = usage_rows(datetime.date(2026, 3, 1), datetime.date(2026, 3, 31), period=MONTH)
    assert [(r["period"], r["rule"], r["units"], r["allowed"], r["refused"]) for r in month] == \
        [("2026-03", "daily-units", 18, 6, 3), ("2026-03", "tenant-rate", 18, 6, 3)]


@pytest.mark.django_db
def test_a_second_rollup_adds_nothing_and_later_traffic_adds_up(in_berlin, redis_client):
    billing_rules()
    acme, acme_raw = api_key("ann", "acme")
    use_fake_clock(now_ms=berlin_ms(2026, 3, 9, 12))
    assert call(acme_raw, 2) == 200
    flush_and_roll_up()
    assert flush_and_roll_up().batches == 0  # nothing pending: nothing added
    assert UsageRecord.objects.get(rule="daily-units").units == 2
    assert call(acme_raw, 5) == 200
    flush_and_roll_up()
    assert UsageRecord.objects.get(rule="daily-units").units == 7  # added into the row
    assert usage_keys_left(redis_client) == []  # nothing left pending or claimed


@pytest.mark.django_db
def test_a_crash_between_the_commit_and_the_delete_does_not_count_twice(in_berlin,
                                                                        redis_client):
    billing_rules()
    acme, acme_raw = api_key("ann", "acme")
    use_fake_clock(now_ms=berlin_ms(2026, 3, 9, 12))
    assert call(acme_raw, 3) == 200
    limiter().flusher.flush_now()

    class Crash(Exception):
        pass

    def crash():
        raise Crash

    client = limiter().store.metrics_client()
    with pytest.raises(Crash):
        UsageRollup(client, crash_after_commit=crash).run()
    assert UsageRecord.objects.get(rule="daily-units").units == 3  # committed
    claims = redis_client.smembers(fields.usage_claims_key("rl"))
    assert len(claims) == 1  # ... and still claimed in Redis

    assert call(acme_raw, 1) == 200
    limiter().flusher.flush_now()
    result = UsageRollup(client).run()
    assert (result.batches, result.already_added) == (1, 1)  # the new one; the old deleted only
    assert UsageRecord.objects.get(rule="daily-units").units == 4
    assert RollupBatch.objects.count() == 2
    assert usage_keys_left(redis_client) == []


@pytest.mark.django_db
def test_a_crash_before_the_commit_is_added_by_the_next_rollup(in_berlin, redis_client):
    billing_rules()
    acme, acme_raw = api_key("ann", "acme")
    use_fake_clock(now_ms=berlin_ms(2026, 3, 9, 12))
    assert call(acme_raw, 3) == 200
    limiter().flusher.flush_now()
    client = limiter().store.metrics_client()
    rollup = UsageRollup(client)
    # claimed, then the process died before its transaction
    rollup._claim(keys=[fields.usage_pending_key("rl"), fields.usage_claimed_key("rl", "dead"),
                        fields.usage_claims_key("rl")], args=["dead"])
    assert not UsageRecord.objects.exists()
    assert UsageRollup(client).run().batches == 1
    assert UsageRecord.objects.get(rule="daily-units").units == 3


@pytest.mark.django_db
def test_a_flush_whose_reply_is_lost_counts_the_usage_once(in_berlin, redis_server):
    """Redis ran the flush and its reply was lost (a connection cut, a master killed after it
    replicated the write): the flush failed as far as the worker knows, and it is sent again,
    by redis-py's own retry and by the next flush. The usage is added once."""
    import redis

    billing_rules()
    acme, acme_raw = api_key("ann", "acme")
    use_fake_clock(now_ms=berlin_ms(2026, 3, 9, 12))
    assert call(acme_raw, 3) == 200
    proxy = ReplyDroppingProxy(redis_server.port).start()
    flusher = limiter().flusher
    direct = flusher.client_provider
    try:
        through_proxy = redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=1)
        flusher.client_provider = lambda: through_proxy
        proxy.drop_replies_to = b"HINCRBY"
        assert flusher.flush_now() == 0  # failed, as far as this worker knows
        assert proxy.dropped >= 1
        proxy.drop_replies_to = None
        assert flusher.flush_now() > 0  # sent again
    finally:
        flusher.client_provider = direct
        proxy.stop()
    UsageRollup(limiter().store.metrics_client()).run()
    assert UsageRecord.objects.get(rule="daily-units").units == 3


@pytest.mark.django_db
def test_anonymous_callers_are_one_identity_and_refused_requests_charge_nothing(in_berlin):
    rule = Rule(name="ip-burst", scope="ip", rate=2, period_s=3600, burst=2)
    rule.full_clean()
    rule.save()
    use_fake_clock(now_ms=berlin_ms(2026, 3, 9, 12))
    codes = [Client().get("/hello/", REMOTE_ADDR=f"10.0.0.{i % 2}").status_code
             for i in range(6)]
    assert codes == [200, 200, 200, 200, 429, 429]
    flush_and_roll_up()
    assert records() == {("2026-03-09", "anonymous", "", "ip-burst"): (4, 4, 2)}


# --- reading the records: the command, the staff API, the usage endpoint ----------------------

def run_command(*args):
    import io

    from django.core.management import call_command

    out, err = io.StringIO(), io.StringIO()
    call_command("ratelimit", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_the_usage_command_exports_csv_and_json_per_day_and_month():
    create_usage_records(other_tenant="=cmd")
    out, _ = run_command("usage", "--from", "2026-03-01", "--to", "2026-03-31",
                         "--tenant", "acme")
    assert out.splitlines() == [
        "period,identity,display,tenant,rule,units,allowed,refused",
        "2026-03-01,key:1,key:1,acme,daily-units,7,3,1",
        "2026-03-02,key:1,key:1,acme,daily-units,10,4,2"]
    out, _ = run_command("usage", "--from", "2026-02-01", "--to", "2026-03-31",
                         "--period", "month", "--format", "json")
    document = __import__("json").loads(out)
    assert document["from"] == "2026-02-01" and document["period"] == "month"
    assert [(r["period"], r["identity"], r["units"], r["allowed"], r["refused"])
            for r in document["records"]] == [("2026-02", "key:1", 5, 5, 0),
                                               ("2026-03", "user:9", 1, 1, 0),
                                               ("2026-03", "key:1", 17, 7, 3)]
    out, _ = run_command("usage", "--from", "2026-03-02", "--to", "2026-03-02",
                         "--tenant", "=cmd")
    assert out.splitlines()[1] == "2026-03-02,user:9,user:9,'=cmd,daily-units,1,1,0"


@pytest.mark.django_db
def test_the_usage_command_says_what_is_wrong_with_a_range():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"from must be a date as YYYY-MM-DD") as error:
        run_command("usage", "--from", "March", "--to", "2026-03-31")
    assert error.value.returncode == 2
    with pytest.raises(CommandError, match=r"ends \(2026-03-01\) before it starts"):
        run_command("usage", "--from", "2026-03-31", "--to", "2026-03-01")


@pytest.mark.django_db
def test_the_rollup_command_reports_what_it_added(in_berlin):
    billing_rules()
    acme, acme_raw = api_key("ann", "acme")
    use_fake_clock(now_ms=berlin_ms(2026, 3, 9, 12))
    assert call(acme_raw, 2) == 200
    limiter().flusher.flush_now()
    out, _ = run_command("rollup")
    assert out == "Rolled up 1 batch into 2 usage records.\n"
    assert run_command("rollup")[0] == "Rolled up 0 batches into 0 usage records.\n"


@pytest.mark.django_db
def test_the_staff_api_serves_the_records_to_staff_only(client, admin_user):
    create_usage_records(other_tenant="=cmd")
    url = "/ratelimit/usage-records/?from=2026-03-01&to=2026-03-31&tenant=acme"
    refused = client.get(url)
    assert refused.status_code == 403 and refused["Content-Type"] == "application/problem+json"
    staff = get_user_model().objects.create_user("clerk", is_staff=True)
    client.force_login(staff)
    assert client.get(url).status_code == 403  # staff without the permission
    client.force_login(admin_user)
    answer = client.get(url)
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    assert [(r["period"], r["units"]) for r in answer.json()["records"]] == \
        [("2026-03-01", 7), ("2026-03-02", 10)]
    month = client.get(url + "&period=month").json()["records"]
    assert [(r["period"], r["units"], r["refused"]) for r in month] == [("2026-03", 17, 3)]
    bad = client.get("/ratelimit/usage-records/?from=2026-03-01&to=tomorrow")
    assert bad.status_code == 400 and "to must be a date as YYYY-MM-DD" in bad.json()["detail"]


@pytest.mark.django_db
def test_the_usage_endpoint_shows_the_callers_own_month_to_date(in_berlin):
    billing_rules()
    acme, acme_raw = api_key("ann", "acme")
    other, other_raw = api_key("bob", "acme")
    clock = use_fake_clock(now_ms=berlin_ms(2026, 2, 28, 12))
    assert call(acme_raw, 4) == 200  # last month: not in March's
    clock.now_ms = berlin_ms(2026, 3, 9, 12)
    assert [call(acme_raw, 4) for _ in range(3)] == [200, 200, 429]
    assert call(other_raw, 1) == 200
    flush_and_roll_up()
    body = Client().get("/ratelimit/usage/", HTTP_X_API_KEY=acme_raw).json()
    assert body["month_to_date"] == {
        "from": "2026-03-01", "to": "2026-03-09",
        "rules": [{"rule": "daily-units", "units": 8, "allowed": 2, "refused": 1},
                  {"rule": "tenant-rate", "units": 8, "allowed": 2, "refused": 1}]}
    anonymous = Client().get("/ratelimit/usage/").json()
    assert anonymous["month_to_date"] is None


# --- several worker processes, a calendar quota crossing midnight -----------------------------

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 4
SETUP = """
import json
import django
django.setup()
from django.contrib.auth import get_user_model
from ratelimit_app.models import ApiKey, Rule
for fields in ({"name": "daily-units", "scope": "user", "kind": "calendar",
                "calendar_period": "day", "rate": 10},
               {"name": "tenant-rate", "scope": "tenant", "rate": 1000, "period_s": 3600,
                "burst": 1000}):
    rule = Rule(**fields)
    rule.full_clean()  # (fills in a calendar quota's period and burst)
    rule.save()
keys = {}
for tenant in ("acme", "globex"):
    user = get_user_model().objects.create_user(tenant + "-owner")
    key, raw = ApiKey.create_key(user, tenant, raw_key="rk_" + tenant + "_usage_test_key",
                                 tenant=tenant)
    keys[tenant] = [key.id, raw]
print(json.dumps(keys))
"""


def manage(env, *args):
    """Run ``manage.py`` with ``args`` in ``env``; return its stdout (failing on an error)."""
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def usage_site_env(tmp_path, redis_server):
    """The environment of tests/business/usage_site.py on a migrated SQLite file of its own."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.business.usage_site",
           "SQLITE_PATH": str(tmp_path / "db.sqlite3"), "REDIS_URL": redis_server.url,
           "DJANGO_DEBUG": "0"}
    manage(env, "migrate", "--verbosity", "0")
    return env


def traffic_plan(worker, start_ms, costs_from):
    """12 requests a second apart from ``start_ms``, both keys in turn, costs 1 to 3."""
    return [[start_ms + 1000 * i + worker, ("acme", "globex")[(i + worker) % 2],
             1 + (i + costs_from) % 3] for i in range(12)]


def run_workers(env, plans, keys):
    """Run one worker process per plan at once; return the status codes each got."""
    workers = [subprocess.Popen(
        [sys.executable, "-m", "tests.business.usage_traffic",
         json.dumps([[now_ms, keys[tenant][1], cost] for now_ms, tenant, cost in plan])],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for plan in plans]
    codes = []
    for process in workers:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        codes.append(json.loads(out))
    return codes


@pytest.mark.django_db  # (the records live in the workers' own SQLite file)
def test_records_from_several_processes_are_exact_to_the_unit(tmp_path, redis_server):
    env = usage_site_env(tmp_path, redis_server)
    done = subprocess.run([sys.executable, "-c", SETUP], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    keys = json.loads(done.stdout)
    # the minute before midnight in Berlin, then the minute after, each from WORKERS processes
    # at once (the test clocks of a phase agree on the day: Redis's clock would)
    plans, codes = [], []
    for phase, start_ms in enumerate((berlin_ms(2026, 3, 9, 23, 59), berlin_ms(2026, 3, 10))):
        phase_plans = [traffic_plan(worker, start_ms, phase) for worker in range(WORKERS)]
        codes += run_workers(env, phase_plans, keys)
        plans += phase_plans

    # what the buckets charged, from what every worker was answered
    expected = {}
    for plan, answers in zip(plans, codes):
        for (now_ms, tenant, cost), code in zip(plan, answers):
            assert code in (200, 429, 0)
            if code == 0:
                continue  # decided without Redis (see usage_traffic.py): nothing charged
            day = datetime.datetime.fromtimestamp(now_ms / 1000, BERLIN).date().isoformat()
            for rule in ("daily-units", "tenant-rate"):
                units, allowed, refused = expected.get((day, tenant, rule), (0, 0, 0))
                expected[(day, tenant, rule)] = (units + cost * (code == 200),
                                                 allowed + (code == 200), refused + (code == 429))
    assert sum(answers.count(0) for answers in codes) <= 2  # (a loaded machine, rarely)
    assert all(expected[(day, tenant, "daily-units")][0] <= 10 and
               expected[(day, tenant, "daily-units")][2] > 0
               for day in ("2026-03-09", "2026-03-10") for tenant in keys), (expected, codes)

    # two rollups at once: each batch is added by one of them
    rollups = [subprocess.Popen([sys.executable, "manage.py", "ratelimit", "rollup"], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(2)]
    for process in rollups:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    manage(env, "ratelimit", "rollup")  # and once more: nothing left to add
    document = json.loads(manage(env, "ratelimit", "usage", "--from", "2026-03-09",
                                 "--to", "2026-03-10", "--format", "json"))
    got = {(r["period"], r["tenant"], r["rule"]): (r["units"], r["allowed"], r["refused"])
           for r in document["records"]}
    assert got == expected
    assert {r["identity"] for r in document["records"]} == \
        {f"key:{key_id}" for key_id, _ in keys.values()}


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_the_rollup_loop_stops_cleanly_on_ctrl_c_and_sigterm(tmp_path, redis_server,
                                                              stop_signal):
    # `rollup --every` runs as a process of its own (make run starts one); a signal stops it
    # between two rounds, without a traceback, rather than killing it in the middle of one
    env = usage_site_env(tmp_path, redis_server)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "ratelimit", "rollup", "--every", "3600"], cwd=ROOT,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "the rollup loop did not start"
        assert process.stdout.readline().startswith("Rolling up the usage counts every 3600 s")
        process.send_signal(stop_signal)
        out, err = process.communicate(timeout=30)  # not an hour: the wait ends at the signal
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert out.strip() == "Usage rollup stopped."
    assert "Traceback" not in err


# --- Redis Cluster: a refused decision's refunded group charged nothing -------------------------

@pytest.mark.slow
@pytest.mark.django_db
def test_on_a_cluster_a_refused_decision_is_refunded_and_recorded_as_refused(redis_cluster,
                                                                             settings):
    from ratelimit_app.decision.buckets import read_state

    redis_cluster.ensure_healthy()
    redis_cluster.flushall()
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP,
                              "CLUSTER_NODES": [redis_cluster.nodes[0].address],
                              "CALENDAR_TIME_ZONE": "Europe/Berlin"}
    quota = Rule(name="tenant-month", scope="tenant", kind="calendar", calendar_period="month",
                 rate=5)
    bucket = Rule(name="key-once", scope="user", rate=1, period_s=3600, burst=1)
    for rule in (quota, bucket):
        rule.full_clean()
        rule.save()
    acme, acme_raw = api_key("ann", "acme")
    use_fake_clock(now_ms=berlin_ms(2026, 3, 9, 12))
    assert [call(acme_raw, 1) for _ in range(3)] == [200, 429, 429]
    buckets = {k.decode() for node in redis_cluster.masters() for k in node.client().keys("rl:{*")}
    assert len({redis_cluster.slot_of(k) for k in buckets}) == 2  # two groups: refunds
    quota_key = next(k for k in buckets if "tenant" in k)
    with redis_cluster.client() as client:
        # the refused requests' debits of the quota were refunded
        assert read_state(client.get(quota_key), quota.id)[0] == 1

    result = flush_and_roll_up()  # the claim script's keys share one slot
    assert result.batches == 1
    key = f"key:{acme.id}"
    assert records() == {("2026-03-09", key, "acme", "tenant-month"): (1, 1, 2),
                         ("2026-03-09", key, "acme", "key-once"): (1, 1, 2)}
