"""The audit trail across processes, on the suite's database (an SQLite file, or PostgreSQL in
that cell: the ``database_env`` fixture): processes recording at once keep one consistent chain
(the unique previous-entry link makes the later one retry), and a restore is one transaction
that another process sees either not at all or whole.

Each process is a real ``python`` on the demo project; the rows are read through Django in
another process on the same database.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WRITER = """
import django
django.setup()
import os, sys, time
from ratelimit_app.models import Rule
name, count, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)  # the test's start signal, so that the writers race
for n in range(count):
    # committed at once (autocommit): recorded right after, by this process
    Rule.objects.create(name=f"{name}-{n}", scope="ip", rate=1, period_s=60, burst=1)
"""

TRAIL = """
import django
django.setup()
import json
from ratelimit_app.config import audit
from ratelimit_app.models import AuditEntry, Rule
entries = list(AuditEntry.objects.order_by("id").values("id", "previous_id", "diff",
                                                         "source", "restored_from_id"))
for entry in entries:  # the configuration after each, rebuilt from its checkpoint
    entry["snapshot"] = audit.document_of(AuditEntry.objects.get(id=entry["id"]))
print(json.dumps({
    "entries": entries,
    "current": audit.audit_document(),
    "rules": sorted([name, burst] for name, burst in Rule.objects.values_list("name", "burst")),
    "rediffs": [audit.diff_documents(before["snapshot"], after["snapshot"])
                for before, after in zip(entries, entries[1:])],
}))
"""

RESTORER = """
import django
django.setup()
import os, sys, time
from django.contrib.auth.models import User
from django.db.models.signals import post_delete, post_save
from ratelimit_app.config import audit
from ratelimit_app.models import AuditEntry, Rule
mode, go = sys.argv[1], sys.argv[2]
for n in range(3):
    Rule.objects.create(name=f"kept-{n}", scope="ip", rate=1, period_s=60, burst=1)
old = AuditEntry.objects.order_by("-id").first()
for rule in Rule.objects.filter(name__startswith="kept-"):
    rule.burst = 5
    rule.save()
for n in range(2):
    Rule.objects.create(name=f"extra-{n}", scope="ip", rate=1, period_s=60, burst=1)
operator = User.objects.create(username="operator")
writes = []

def midway(sender, **kwargs):
    # inside the restore's transaction: hold after its first write until the test has looked;
    # in mode "fail", fail at the second
    writes.append(sender)
    if len(writes) == 1:
        print("midway", flush=True)
        while not os.path.exists(go):
            time.sleep(0.005)  # the test's signal to go on
    elif mode == "fail":
        raise RuntimeError("failed midway")

post_save.connect(midway, sender=Rule)
post_delete.connect(midway, sender=Rule)
try:
    audit.restore(old, operator)
    print("restored", flush=True)
except RuntimeError as error:
    print(error, flush=True)
"""

FIRST_WRITER = """
import django
django.setup()
import os, sys, time
from django.db.models.signals import pre_save
from ratelimit_app.models import AuditEntry, Rule
name, go = sys.argv[1], sys.argv[2]
held = []

def hold_first_attempt(sender, instance, **kwargs):
    # after reading the (empty) trail, before writing: every writer has read it empty before
    # any writes its entry; a retry is not held
    if not held:
        held.append(instance)
        print("holding", instance.previous_id, flush=True)
        while not os.path.exists(go):
            time.sleep(0.005)  # the test's signal to go on

pre_save.connect(hold_first_attempt, sender=AuditEntry)
Rule.objects.create(name=name, scope="ip", rate=1, period_s=60, burst=1)
"""

# What two processes recording into an empty trail at once could leave before migration 0010:
# two entries without a previous one (written with the models of 0009), and one following.
OLD_TRAIL = """
import django
django.setup()
from django.db import connection
from django.db.migrations.loader import MigrationLoader
state = MigrationLoader(connection).project_state(("ratelimit_app", "0009_usage_records"))
AuditEntry = state.apps.get_model("ratelimit_app", "AuditEntry")
baseline = AuditEntry.objects.get()
second_first = AuditEntry.objects.create(actor="race", source="code", summary="also first",
                                         snapshot=baseline.snapshot)
AuditEntry.objects.create(actor="later", source="code", summary="after it",
                          snapshot=baseline.snapshot, previous=second_first)
"""

FIRST_MARKS = """
import django
django.setup()
import json
from ratelimit_app.models import AuditEntry, Rule
Rule.objects.create(name="after-migration", scope="ip", rate=1, period_s=60, burst=1)
print(json.dumps(list(AuditEntry.objects.order_by("id").values_list("opens_trail",
                                                                   "previous_id", "id"))))
"""

BEFORE_RESTORE = [["extra-0", 1], ["extra-1", 1], ["kept-0", 5], ["kept-1", 5], ["kept-2", 5]]
RESTORED = [["kept-0", 1], ["kept-1", 1], ["kept-2", 1]]


def python(env, *args):
    """Run ``python *args`` in the project with ``env``; return its stdout."""
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def start(env, *args):
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(process):
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return out


@pytest.fixture
def env(tmp_path, redis_server, database_env):
    """The demo project's environment on a migrated database of its own (its trail holds the
    migration's first entry)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings", **database_env(tmp_path),
           "REDIS_URL": redis_server.url, "DJANGO_DEBUG": "0"}
    python(env, "manage.py", "migrate", "--verbosity", "0")
    return env


def trail(env):
    """Return the trail's entries (oldest first), the configuration now, the rules as
    ``[name, burst]`` and each entry's diff computed again against the entry before it."""
    return json.loads(python(env, "-c", TRAIL))


def assert_one_chain_adding(got, names):
    """Assert that the trail ``got`` is one chain whose diffs add each rule of ``names`` once."""
    entries = got["entries"]
    # one chain: each entry follows the one recorded just before it, none is followed twice
    assert entries[0]["previous_id"] is None
    assert [e["previous_id"] for e in entries[1:]] == [e["id"] for e in entries[:-1]]
    # each diff is against the entry it follows (the row each item is in now aside: a diff
    # of documents cannot know it), and the last entry is the configuration now
    assert [[{name: value for name, value in change.items() if name != "row"}
             for change in e["diff"]] for e in entries[1:]] == got["rediffs"]
    assert entries[-1]["snapshot"] == got["current"]
    # every rule created is in the trail exactly once, as an addition
    added = [change["label"] for entry in entries for change in entry["diff"]
             if change["action"] == "add" and change["section"] == "rules"]
    assert sorted(added) == sorted(f"rule “{name}”" for name in names)


def test_processes_recording_at_once_keep_one_chain_with_every_change_in_it(env, tmp_path):
    go = tmp_path / "go"
    writers = [start(env, "-c", WRITER, f"w{n}", "5", str(go)) for n in range(4)]
    for writer in writers:
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
    go.touch()
    for writer in writers:
        finish(writer)

    got = trail(env)
    names = [f"w{w}-{n}" for w in range(4) for n in range(5)]
    assert got["entries"][0]["source"] == "migrate"
    assert_one_chain_adding(got, names)
    assert len(got["entries"]) <= 1 + len(names)  # a change committed meanwhile may share one


def test_processes_recording_into_an_empty_trail_at_once_write_one_first_entry(env, tmp_path):
    python(env, "-c", "import django; django.setup(); "
                      "from ratelimit_app.models import AuditEntry; "
                      "AuditEntry.objects.all().delete()")
    go = tmp_path / "go"
    names = [f"first-{n}" for n in range(4)]
    writers = [start(env, "-c", FIRST_WRITER, name, str(go)) for name in names]
    try:
        # every writer read the trail empty and is about to write the first entry
        for writer in writers:
            assert writer.stdout.readline() == "holding None\n", writer.stderr.read()
    finally:
        go.touch()
    for writer in writers:
        finish(writer)

    got = trail(env)
    # one of them wrote the first entry; the others retried after it (the constraint)
    assert_one_chain_adding(got, names)
    assert [e["previous_id"] for e in got["entries"]].count(None) == 1


def test_the_first_entry_migration_applies_to_a_trail_with_entries(env):
    python(env, "manage.py", "migrate", "ratelimit_app", "0009_usage_records", "--verbosity", "0")
    python(env, "-c", OLD_TRAIL)
    python(env, "manage.py", "migrate", "--verbosity", "0")

    marks = json.loads(python(env, "-c", FIRST_MARKS))
    # the oldest entry opens the trail, the other entry without a previous one does not; a
    # change recorded after the migration follows the last entry
    assert [opens for opens, _, _ in marks] == [True, False, False, False]
    assert marks[-1][1] == marks[-2][2]


@pytest.mark.parametrize("mode", ["commit", "fail"])
def test_a_restore_is_one_transaction_seen_whole_or_not_at_all(env, tmp_path, mode):
    go = tmp_path / "go"
    restorer = start(env, "-c", RESTORER, mode, str(go))
    try:
        assert restorer.stdout.readline() == "midway\n", restorer.stderr.read()
        # another process, while the restore has written its first row: nothing of it yet
        during = trail(env)
        assert during["rules"] == BEFORE_RESTORE
    finally:
        go.touch()
    out = finish(restorer)
    after = trail(env)
    entries = after["entries"]
    if mode == "commit":
        assert out.endswith("restored\n")
        assert after["rules"] == RESTORED
        # one entry for the whole restore, following the last entry before it
        assert entries[:-1] == during["entries"]
        assert entries[-1]["source"] == "restore"
        assert entries[-1]["previous_id"] == during["entries"][-1]["id"]
        restored_from = next(e for e in entries if e["id"] == entries[-1]["restored_from_id"])
        assert entries[-1]["snapshot"]["rules"] == restored_from["snapshot"]["rules"]
    else:
        assert out.endswith("failed midway\n")
        assert after["rules"] == BEFORE_RESTORE  # the first write was rolled back too
        assert entries == during["entries"]  # and nothing recorded
