"""What a flood of addresses can make the penalty box write, on real servers (issue 56): gunicorn
with 3 sync workers and their background threads on, behind a trusted proxy (callers told apart
by X-Forwarded-For). 300 IPv6 callers walking three 404s each are each refused at once (the ban
lives in Redis), and the workers' ban-log threads write, whatever the number of addresses, per
rule and interval (BAN_LOG_INTERVAL_S): one ban-log entry, at most BAN_ROWS_PER_INTERVAL Ban
rows, one ``caller.banned`` delivery per endpoint, no audit entry; a shadow rule the same, with
no delivery. A ban's row appears within the log's round (ALERTS_DRAIN_INTERVAL_S) of the ban.
Several workers add to one entry at once: marked ``database``, the PostgreSQL cell runs it too."""

import ipaddress
import json
import subprocess
import sys
import threading
import time

import pytest

from ..asgi_server import PROJECT_ROOT, get
from ..config.test_reload_live import python
from .test_bans_servers import start_deployment

pytestmark = [pytest.mark.slow, pytest.mark.deployment, pytest.mark.database]

FLOOD = 300
ROWS_PER_INTERVAL = 20  # BAN_ROWS_PER_INTERVAL's default
INTERVAL_S = 60         # BAN_LOG_INTERVAL_S's default
ROUND_S = 1.0           # ALERTS_DRAIN_INTERVAL_S's default
SETUP = """
import django
django.setup()
from ratelimit_app.models import BanRule, Plan, Rule, WebhookEndpoint
plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
Rule.objects.create(name="live-ip", plan=plan, scope="ip", rate=1000, period_s=1, burst=100000)
BanRule.objects.create(name="walkers", scope="ip", events="statuses", statuses="404",
                       path_prefix="/walk", threshold=3, window_s=60, ban_s=60)
BanRule.objects.create(name="watchers", scope="ip", events="statuses", statuses="404",
                       path_prefix="/watch", threshold=3, window_s=60, ban_s=60, mode="shadow")
WebhookEndpoint.objects.create(name="soc", url="https://example.com/hook")
"""
COUNTS = """
import json
import django
django.setup()
from ratelimit_app.models import AuditEntry, Ban, BanLogEntry, WebhookDelivery
print(json.dumps({
    "rows": {rule: Ban.objects.filter(rule_name=rule).count() for rule in ("walkers", "watchers")},
    "entries": [[e.rule_name, e.shadow, e.bans, len(e.callers)]
                for e in BanLogEntry.objects.filter(kind="banned")],
    "deliveries": WebhookDelivery.objects.filter(event="caller.banned").count(),
    "audit": AuditEntry.objects.count(),
}))
"""
# Waits (polling, with a deadline) for the Ban row of argv[1]; prints when it saw it (epoch s)
ROW_SEEN = """
import sys, threading, time
import django
django.setup()
from ratelimit_app.models import Ban
print("ready", flush=True)
deadline = time.time() + float(sys.argv[2])
while time.time() < deadline:
    if Ban.objects.filter(who=sys.argv[1]).exists():
        print(time.time(), flush=True)
        break
    threading.Event().wait(0.02)
else:
    print("none", flush=True)
"""


@pytest.fixture(scope="module", params=[("gunicorn", "redis")], ids="-".join)
def deployment(request, tmp_path_factory, redis_server, database_env):
    yield from start_deployment(request, tmp_path_factory, redis_server, database_env, SETUP,
                                DEMO_BEHIND_PROXY="1")


def address(i, net=0):
    return f"2001:db8:{net:x}:{i:x}::1"


def network(i, net=0):
    return str(ipaddress.ip_network(f"2001:db8:{net:x}:{i:x}::/64"))


def counts(env):
    return json.loads(python(["-c", COUNTS], env))


def entries_of(env, rule):
    return [entry for entry in counts(env)["entries"] if entry[0] == rule]


def flood(server, prefix, net, threads=6):
    """Walk three 404s under ``prefix`` from each of FLOOD addresses, then ask /hello/ once;
    return each address's answer to that question and the slowest request's seconds."""
    answers, slowest = {}, [0.0]

    def walk(indexes):
        for i in indexes:
            for step in range(3):
                answer = get(server, f"{prefix}/{step}/", address(i, net))
                assert answer.status == 404
                slowest[0] = max(slowest[0], answer.seconds)
            answer = get(server, "/hello/", address(i, net))
            answers[i] = answer
            slowest[0] = max(slowest[0], answer.seconds)

    workers = [threading.Thread(target=walk, args=(range(n, FLOOD, threads),))
               for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return answers, slowest[0]


def intervals_touched(started, ended):
    return int(ended // INTERVAL_S) - int(started // INTERVAL_S) + 1


def before_bans(before, rule):
    """The bans ``rule``'s ban-log entries counted in ``before`` (what ``counts`` read)."""
    return sum(entry[2] for entry in before["entries"] if entry[0] == rule)


def wait_for_total(env, rule, total, timeout_s=15):
    """Poll (with a deadline) until ``rule``'s ban-log entries count ``total`` bans."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = entries_of(env, rule)
        if sum(entry[2] for entry in found) >= total:
            return found
        assert time.monotonic() < deadline, f"{rule}'s log counts {found}, not {total}"


def test_a_ban_is_refused_at_once_and_its_row_written_within_a_round(deployment):
    server, env, _, _ = deployment
    caller = address(1, net=0xFF)
    with subprocess.Popen([sys.executable, "-c", ROW_SEEN, network(1, net=0xFF), "20"],
                          cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True) as watcher:
        assert watcher.stdout.readline().strip() == "ready"
        for step in range(3):
            assert get(server, f"/walk/{step}/", caller).status == 404
        banned_at = time.time()
        refused = get(server, "/hello/", caller)  # while the row is pending: refused already
        assert refused.status == 429 and refused.json()["banned-by"] == ["walkers"]
        seen = watcher.stdout.readline().strip()
    assert seen != "none", "the ban's row was never written"
    delay = float(seen) - banned_at
    print(f"the ban's row written {delay:.2f} s after the ban")
    assert delay < ROUND_S + 1.0


def test_a_flood_of_banned_addresses_writes_a_bounded_record(deployment):
    server, env, _, _ = deployment
    before = counts(env)
    started = time.time()
    answers, slowest = flood(server, "/walk", net=1)
    ended = time.time()
    # every address refused at once, by Redis, whatever has been written yet
    assert {answer.status for answer in answers.values()} == {429}
    assert all(json.loads(answer.body)["banned-by"] == ["walkers"]
               for answer in answers.values())
    entries = wait_for_total(env, "walkers", before_bans(before, "walkers") + FLOOD)
    after = counts(env)
    intervals = intervals_touched(started, ended)
    new_entries = len(entries) - len([e for e in before["entries"] if e[0] == "walkers"])
    print(f"flood of {FLOOD} addresses in {ended - started:.1f} s (slowest request "
          f"{slowest:.3f} s): {after['rows']['walkers'] - before['rows']['walkers']} rows, "
          f"{new_entries} log entries, {after['deliveries'] - before['deliveries']} deliveries, "
          f"{after['audit'] - before['audit']} audit entries, over {intervals} interval(s)")
    assert len(entries) <= intervals + 1  # (+1: the earlier test's ban, in its own interval)
    assert 0 < after["rows"]["walkers"] - before["rows"]["walkers"] <= ROWS_PER_INTERVAL * intervals
    assert all(listed <= ROWS_PER_INTERVAL for *_, listed in entries)
    assert after["deliveries"] - before["deliveries"] <= intervals  # one endpoint
    assert after["audit"] == before["audit"]
    # still refused, listed or not
    assert {get(server, "/hello/", address(i, net=1)).status for i in (0, FLOOD - 1)} == {429}


def test_a_shadow_rule_writes_a_bounded_record_and_refuses_no_one(deployment):
    server, env, _, _ = deployment
    before = counts(env)
    started = time.time()
    answers, _ = flood(server, "/watch", net=2)
    ended = time.time()
    assert {answer.status for answer in answers.values()} == {200}
    entries = wait_for_total(env, "watchers", FLOOD)
    after = counts(env)
    intervals = intervals_touched(started, ended)
    assert all(shadow for _, shadow, *_ in entries) and len(entries) <= intervals
    assert 0 < after["rows"]["watchers"] <= ROWS_PER_INTERVAL * intervals
    assert after["deliveries"] == before["deliveries"]  # would-be bans are not announced
    assert after["audit"] == before["audit"]
