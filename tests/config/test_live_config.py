"""An admin edit saved in one process is enforced by another process within about a second.

Two real Django processes share a SQLite file and the suite's redis-server: an *editor* saves a
Rule (commit → on_commit → config version bump) and a *worker* decides requests one at a time on
demand. The test asks the worker for decisions until it enforces the new numbers, with a
deadline, and reports how long that took.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import commands_sent, limiter

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 2.0  # the contract says "about a second"
HUGE = 1_000_000  # a burst the worker's own traffic cannot exhaust before the edit

# Decides one request to the plain view `hello` per line read from stdin; exits at EOF.
WORKER = """
import json, sys, time
import django
django.setup()
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory
from ratelimit_app.runtime.limiter import default_limiter

factory = RequestFactory()
print("ready", flush=True)
for _ in sys.stdin:
    decision = default_limiter().decide(factory.get("/hello/", REMOTE_ADDR="192.0.2.1"),
                                        AnonymousUser(), "hello")
    print(json.dumps({"at": time.time(), "allowed": decision.allowed,
                      "bursts": {p.name: p.burst for p in decision.policies},
                      "violated": list(decision.violated)}), flush=True)
"""

# Applies one edit given as JSON in argv[1] in a transaction; prints when it committed.
EDITOR = """
import json, sys, time
import django
django.setup()
from django.core.management import call_command
from django.db import transaction
from ratelimit_app.models import Plan, Rule

edit = json.loads(sys.argv[1])
plan = Plan.objects.get(slug="free")
if edit["action"] == "loaddata":  # rules of the free plan, as a fixture (one transaction)
    with open(edit["path"], "w") as fixture:
        json.dump([{"model": "ratelimit_app.rule", "fields": {**fields, "plan": plan.pk}}
                   for fields in edit["rules"]], fixture)
    committing_at = time.time()  # (at the latest: loaddata commits inside)
    call_command("loaddata", edit["path"], verbosity=0)
else:
    with transaction.atomic():
        if edit["action"] == "create":
            Rule.objects.create(plan=plan, **edit["fields"])
        else:
            rule = Rule.objects.get(name=edit["name"])
            for field, value in edit["fields"].items():
                setattr(rule, field, value)
            rule.save()  # as the admin does: post_save -> on_commit -> version bump
        committing_at = time.time()
print(json.dumps({"committing_at": committing_at}), flush=True)
"""

SETUP = f"""
import django
django.setup()
from ratelimit_app.models import Plan, Rule
Rule.objects.all().delete()
Plan.objects.all().delete()
plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
Rule.objects.create(name="live", plan=plan, scope="ip", rate=1, period_s=60, burst={HUGE})
"""


@pytest.fixture(scope="module")
def shared_db(tmp_path_factory, redis_server, database_env):
    """A migrated database both processes use (apart from the suite's own test database)."""
    workdir = tmp_path_factory.mktemp("live-config")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **database_env(workdir),
           "REDIS_URL": redis_server.url}
    run(["manage.py", "migrate", "--verbosity", "0"], env)
    return env


def run(args, env):
    """Run a Python script or ``-c`` program in the project directory; return its stdout."""
    done = subprocess.run([sys.executable, *args], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


class Worker:
    """The second Django process, deciding one request per ``decide()``."""

    def __init__(self, env):
        self.process = subprocess.Popen([sys.executable, "-c", WORKER], cwd=PROJECT_ROOT,
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def decide(self):
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def stop(self):
        self.process.stdin.close()  # the worker exits at EOF
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.process.stdout.close()


@pytest.fixture
def worker(shared_db):
    run(["-c", SETUP], shared_db)
    started = Worker(shared_db)
    yield started
    started.stop()


def enforced_after_edit(worker, env, change, condition):
    """Start the editor process and ask the worker for decisions meanwhile, until
    ``condition(decision)``. Return ``(decision, seconds from the commit to that decision)``;
    fail if that takes longer than DEADLINE_S."""
    editor = subprocess.Popen([sys.executable, "-c", EDITOR, json.dumps(change)],
                              cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        committing_at = None
        while True:
            decision = worker.decide()
            if committing_at is None and editor.poll() is not None:
                assert editor.returncode == 0, "the editor failed"
                committing_at = json.loads(editor.stdout.read())["committing_at"]
            if condition(decision):
                break
            assert committing_at is None or decision["at"] < committing_at + DEADLINE_S, \
                f"not enforced within {DEADLINE_S} s of the commit: {decision}"
        if committing_at is None:  # enforced before the editor process had even exited
            editor.wait(60)
            committing_at = json.loads(editor.stdout.read())["committing_at"]
    finally:
        if editor.poll() is None:
            editor.kill()
        editor.wait(60)
        editor.stdout.close()
    return decision, decision["at"] - committing_at


def test_edited_rule_is_enforced_by_a_busy_worker_within_a_second(worker, shared_db):
    before = worker.decide()
    assert before["allowed"] and before["bursts"] == {"live": HUGE}

    decision, propagation_s = enforced_after_edit(
        worker, shared_db, {"action": "update", "name": "live", "fields": {"burst": 2}},
        lambda d: d["bursts"] == {"live": 2})
    print(f"\nbusy worker enforced the edited rule {propagation_s * 1000:.0f} ms after commit")
    assert 0 < propagation_s < 1.0

    # the new numbers are enforced, not only reported: the full bucket shrank to a burst of 2
    results = [decision["allowed"]] + [worker.decide()["allowed"] for _ in range(2)]
    assert results == [True, True, False]
    assert worker.decide()["violated"] == ["live"]


def test_new_rule_reaches_an_idle_worker_through_the_version_poll(worker, shared_db):
    assert worker.decide()["bursts"] == {"live": HUGE}
    # move the only rule away from `hello`: from then on the worker's requests make no Lua
    # call, so nothing brings it the new version but its once-a-second poll
    enforced_after_edit(worker, shared_db,
                        {"action": "update", "name": "live", "fields": {"endpoint": "api:items"}},
                        lambda d: d["bursts"] == {})

    new_rule = {"name": "hello-ip", "scope": "ip", "endpoint": "hello", "rate": 1,
                "period_s": 60, "burst": 1}
    decision, propagation_s = enforced_after_edit(
        worker, shared_db, {"action": "create", "fields": new_rule},
        lambda d: d["bursts"] == {"hello-ip": 1})
    print(f"\nidle worker enforced the new rule {propagation_s * 1000:.0f} ms after commit")
    assert 0 < propagation_s < DEADLINE_S
    assert decision["allowed"]
    assert worker.decide()["violated"] == ["hello-ip"]


def test_a_fixture_of_many_rules_is_one_new_version_and_reaches_a_busy_worker(
        worker, shared_db, redis_server, tmp_path):
    """``manage.py loaddata`` of six rules: one transaction, so one version bump at its commit
    (one reload per worker, not six), and the worker enforces all six within the bound."""
    rules = [{"name": f"loaded-{i}", "scope": "ip", "endpoint": "hello", "rate": 1,
              "period_s": 60, "burst": HUGE - i, "updated": "2026-01-01T00:00:00Z"}
             for i in range(6)]
    loaded = {"live": HUGE, **{rule["name"]: rule["burst"] for rule in rules}}
    assert worker.decide()["bursts"] == {"live": HUGE}
    with commands_sent(redis_server.client()) as sent:
        decision, propagation_s = enforced_after_edit(
            worker, shared_db,
            {"action": "loaddata", "path": str(tmp_path / "rules.json"), "rules": rules},
            lambda d: d["bursts"] == loaded)
    print(f"\nbusy worker enforced the loaded fixture {propagation_s * 1000:.0f} ms after commit")
    assert 0 < propagation_s < DEADLINE_S
    version_key = limiter().version_key
    assert [c for c in sent if c.startswith(f"set {version_key} ")] == \
        [f"set {version_key} {limiter().read_version()}"]
