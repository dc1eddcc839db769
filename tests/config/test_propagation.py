"""Once a new config version is published, no request that starts after that moment is decided
on older rules, on any worker of a real server; dated overrides switch at their moments; a
change made without a signal is found without traffic and recorded once.

Each module fixture runs a real server (gunicorn with 3 sync workers, uvicorn with 2) on its
own migrated database, against the suite's redis-server or the 3-master Cluster, with the
workers' background threads on. The servers run tests/config/propagation_settings.py: every limited
response says which config version decided it (RateLimit-Config-Version) and in which worker
(RateLimit-Worker). Another Python process makes the changes, as an admin or a script would;
client threads record when each request started and ended and what its answer said, and the
assertions hold for every answer, not only the last one.

The client is 127.0.0.1 for every request: the servers trust no proxy, so X-Forwarded-For is
not read and the dated override names that address.
"""

import json
import os
import re
import threading
import time
from typing import NamedTuple

import pytest

from ratelimit_app.conf import DEFAULTS

from ..asgi_server import Gunicorn, Uvicorn, get
from ..helpers import poll_until, server_store
from .test_reload_live import SETUP, VERSION_KEY, python, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.deployment, pytest.mark.database]

RELOAD_INTERVAL_S = 2.0   # the servers' CONFIG_RELOAD_INTERVAL_S
EDITS, EDIT_GAP_S = 6, 0.5
CLIENT_IP = "127.0.0.1"
GRACE_S = 0.1             # a dated override is judged from 100 ms after its moments
OVERRIDE_LEAD_S = OVERRIDE_LENGTH_S = 3.0
AROUND_S = 0.5            # traffic around a moment: this long before it (busy) and after it
OVERRIDE_RATE, OVERRIDE_BURST = 500, 777  # per second; q=777 in RateLimit-Policy
LOAD_THREADS = 6
# the deny cache answers only while the version was confirmed within two watcher polls (100 ms);
# the rest is a busy machine's scheduling
LOCAL_REFUSALS_S = 0.25
SERVERS = {"gunicorn": (Gunicorn, 3), "uvicorn": (Uvicorn, 2)}

# `rule.save()` of live-ip's burst + 1, every gap: the signal publishes a version. Prints, after
# each save returned, the time, the burst saved and the version in Redis.
EDIT = """
import json, sys, threading, time
import django
django.setup()
from ratelimit_app.runtime.limiter import default_limiter
from ratelimit_app.models import Rule
count, gap_s = int(sys.argv[1]), float(sys.argv[2])
rule = Rule.objects.get(name="live-ip")
due = time.monotonic()
for _ in range(count):
    threading.Event().wait(max(0.0, due - time.monotonic()))
    due += gap_s
    rule.burst += 1
    saving = time.time()
    rule.save()
    saved_at = time.time()
    print(json.dumps({"at": saved_at, "burst": rule.burst, "saving": saving,
                      "version": default_limiter().read_version()}), flush=True)
"""

# live-ip down to argv[1] requests an hour, saved (a version published); printed as EDIT does.
STARVE = """
import json, sys, time
import django
django.setup()
from ratelimit_app.runtime.limiter import default_limiter
from ratelimit_app.models import Rule
rule = Rule.objects.get(name="live-ip")
rule.rate, rule.period_s, rule.burst = 1, 3600, int(sys.argv[1])
rule.save()
saved_at = time.time()
print(json.dumps({"at": saved_at, "burst": rule.burst,
                  "version": default_limiter().read_version()}))
"""

# A dated override of the client's numbers on live-ip, starting argv[1] s from now and lasting
# argv[2] s. Prints its moments (epoch s).
OVERRIDE = f"""
import json, sys, time
from datetime import datetime, timezone
import django
django.setup()
from ratelimit_app.models import IdentityOverride, Rule
lead_s, length_s = float(sys.argv[1]), float(sys.argv[2])
starts = time.time() + lead_s
override = IdentityOverride.objects.create(
    ip="{CLIENT_IP}", rule=Rule.objects.get(name="live-ip"), rate={OVERRIDE_RATE}, period_s=1,
    burst={OVERRIDE_BURST}, starts_at=datetime.fromtimestamp(starts, timezone.utc),
    ends_at=datetime.fromtimestamp(starts + length_s, timezone.utc))
print(json.dumps({{"starts_at": override.starts_at.timestamp(),
                  "ends_at": override.ends_at.timestamp()}}))
"""

# A queryset update of live-ip's burst: no signal. Prints the version before it, the burst,
# the last audit entry's id and the time it committed.
OUTSIDE_UPDATE = """
import json, time
import django
django.setup()
from ratelimit_app.runtime.limiter import default_limiter
from ratelimit_app.models import AuditEntry, Rule
version = default_limiter().read_version()
last_entry = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
burst = Rule.objects.get(name="live-ip").burst + 1
Rule.objects.filter(name="live-ip").update(burst=burst)
print(json.dumps({"at": time.time(), "burst": burst, "version": version,
                  "last_entry": last_entry}))
"""

# The audit entries after the id argv[1], oldest first.
AUDIT_ENTRIES = """
import json, sys
import django
django.setup()
from ratelimit_app.models import AuditEntry
print(json.dumps([{"source": e.source, "actor": e.actor, "summary": e.summary, "diff": e.diff}
                  for e in AuditEntry.objects.filter(id__gt=int(sys.argv[1])).order_by("id")]))
"""


class Deployment(NamedTuple):
    server: object
    env: dict
    workers: int
    redis: object  # a client of the Redis the server uses (a node, or the Cluster)

    def stored_version(self):
        """Return the config version in Redis ("" when unset)."""
        return (self.redis.get(VERSION_KEY) or b"").decode()


class Published(NamedTuple):
    """A config version, the time (epoch s) by which it was published, and live-ip's burst
    from then on."""

    at: float
    burst: int
    version: str
    # when the save that published it began (EDIT): its version key was written no sooner
    # than CONFIG_PUBLISH_LEAD_S after, its record of changes having come first
    saving: float = 0.0


class Record(NamedTuple):
    """One request: when it started and ended (epoch s) and what its answer said."""

    started: float
    ended: float
    status: int
    version: str | None
    worker: str | None
    burst: int | None  # live-ip's q= in RateLimit-Policy


@pytest.fixture(scope="module", params=[("gunicorn", "redis"), ("gunicorn", "cluster"),
                                        ("uvicorn", "redis"), ("uvicorn", "cluster")],
                ids="-".join)
def deployment(request, tmp_path_factory, redis_server, database_env):
    """A server of the kind, on the store, ``request.param`` names; returns a Deployment.
    (The store is emptied before each test: the workers then read version "0", until a
    test's change publishes one.)"""
    kind, store = request.param
    server_class, workers = SERVERS[kind]
    workdir = tmp_path_factory.mktemp(f"propagation-{kind}-{store}")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.config.propagation_settings",
           "RELOAD_INTERVAL_S": str(RELOAD_INTERVAL_S), **database_env(workdir),
           "DJANGO_DEBUG": "0"}
    client = server_store(request, store, env, redis_server)
    python(["manage.py", "migrate", "--verbosity", "0"], env)
    python(["-c", SETUP], env)
    server = server_class(env, workdir, workers=workers).start()
    yield Deployment(server, env, workers, client)
    stop_server(server)
    client.close()


@pytest.fixture(autouse=True)
def _empty_cluster(request, deployment):
    """Each test starts on an empty store on the Cluster too, as on the suite's redis-server
    (flushed before every test): one test's bucket levels are not the next one's (the busy
    override drains live-ip's bucket down to the override's burst, and the level outlives the
    override)."""
    if request.node.callspec.params["deployment"][1] == "cluster":
        request.getfixturevalue("redis_cluster").flushall()


# --- the client --------------------------------------------------------------------------------

def send(server):
    """Send one request to /hello/; return its Record."""
    started = time.time()
    answer = get(server, "/hello/")
    ended = time.time()
    found = re.search(r'"live-ip";q=(\d+)', answer.headers.get("RateLimit-Policy") or "")
    return Record(started, ended, answer.status, answer.headers.get("RateLimit-Config-Version"),
                  answer.headers.get("RateLimit-Worker"), found and int(found.group(1)))


class Traffic:
    """Client threads sending requests to ``server`` until the block ends, each waiting
    ``pause_s`` between its requests; every Record is appended to ``records``."""

    def __init__(self, server, threads, pause_s=0.0, records=None):
        self.server, self.pause_s = server, pause_s
        self.records = [] if records is None else records
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self):
        while not self._stop.is_set():
            self.records.append(send(self.server))
            if self.pause_s:
                self._stop.wait(self.pause_s)


def converge(deployment, records, version=None, timeout_s=5):
    """Send requests from several threads until every worker has answered one on ``version``
    (default: the version in Redis, "0" when unset, read again at each look), appending their Records to
    ``records``."""
    first = len(records)

    def target():
        return version or deployment.stored_version() or "0"

    def on_target():
        wanted = target()
        return {r.worker for r in records[first:] if r.version == wanted}

    with Traffic(deployment.server, LOAD_THREADS, records=records):
        try:
            poll_until(lambda: len(on_target()) >= deployment.workers, timeout_s)
        except AssertionError:
            last = {r.worker: r.version for r in records[first:]}
            raise AssertionError(
                f"within {timeout_s} s, {len(on_target())} of {deployment.workers} workers "
                f"decided on {target()}; each one's last version: {last}; the version in "
                f"Redis: {deployment.stored_version()}") from None


def wait_until(moment):
    """Return at the wall-clock time ``moment`` (epoch s): a dated row's moment is a time of
    day, and the traffic is timed around it."""
    threading.Event().wait(max(0.0, moment - time.time()))


def traffic_between(server, threads, start, end, records):
    """Send requests from ``threads`` client threads from the time ``start`` until ``end``."""
    wait_until(start)
    with Traffic(server, threads, records=records):
        wait_until(end)


# --- the assertions ----------------------------------------------------------------------------

def assert_decided(records):
    """Every answer was a limiter's decision (200 or 429) saying its version and worker."""
    undecided = [r for r in records if r.status not in (200, 429) or not r.version
                 or not r.worker or r.burst is None]
    statuses = {status: sum(r.status == status for r in undecided)
                for status in {r.status for r in undecided}}
    assert not undecided, f"{len(undecided)} of {len(records)} answers were not decided with " \
                          f"the headers (statuses {statuses}): {undecided[:3]}"


def version_order(published):
    """Return a sort key for config versions: their ms prefix, then their place in
    ``published`` (one unknown there comes before a known one of the same ms)."""
    place = {p.version: i for i, p in enumerate(published)}

    def key(version):
        ms, _, _ = version.partition("-")
        return (int(ms) if ms.isdigit() else -1, place.get(version, -1))
    return key


def assert_never_older(records, published, local_refusals_s=0.0):
    """No request that started after a version was published was decided on an older one, nor
    (the bursts growing with each edit) on an older burst. ``published`` in order. With
    ``local_refusals_s``: but a refusal that started at most that long after a publication
    (a worker's deny cache answers without Redis until its watcher sees the new version)."""
    order = version_order(published)
    late, lateness_ms = [], []
    for r in records:
        floor = next((p for p in reversed(published) if p.at <= r.started), None)
        if floor is None:
            continue
        if r.status == 429 and r.started - floor.at <= local_refusals_s:
            continue
        if order(r.version) < order(floor.version) or r.burst < floor.burst:
            lateness_ms.append((r.started - floor.at) * 1000)
            late.append(f"started {lateness_ms[-1]:.0f} ms after {floor.version} "
                        f"(burst {floor.burst}) was published: worker {r.worker} decided on "
                        f"{r.version} (burst {r.burst}), status {r.status}")
    assert not late, f"{len(late)} of {len(records)} requests decided on older rules (the " \
                     f"latest started {max(lateness_ms):.0f} ms after a newer version):\n" + \
                     "\n".join(late[:10])


def assert_never_ahead(records, edits):
    """No request was decided on an edit's version before that version was published: the
    rules a worker's watcher compiles in the publication's lead (CONFIG_PUBLISH_LEAD_S) are
    installed only once the version key holds their version (and a worker that installed them
    early would have its debits refused by the fence until then). A response can only end after
    the decision it carries, and the version key is written at least the lead after the save
    began."""
    lead_s = DEFAULTS["CONFIG_PUBLISH_LEAD_S"]
    written_after = {e.version: e.saving + lead_s for e in edits}
    early = [f"worker {r.worker}'s answer on {r.version} ended "
             f"{(written_after[r.version] - r.ended) * 1000:.0f} ms before it could be published"
             for r in records
             if r.version in written_after and r.ended < written_after[r.version]]
    assert not early, f"{len(early)} requests decided on a version not yet published:\n" + \
        "\n".join(early[:10])


def by_worker(records):
    return {worker: sum(r.worker == worker for r in records)
            for worker in sorted({r.worker for r in records}, key=str)}


# --- edits -------------------------------------------------------------------------------------

def run_edits(deployment):
    """Run EDIT (EDITS saves, EDIT_GAP_S apart); return the edits as Published."""
    output = python(["-c", EDIT, str(EDITS), str(EDIT_GAP_S)], deployment.env)
    edits = [Published(**json.loads(line)) for line in output.splitlines()]
    assert len({e.version for e in edits}) == EDITS, \
        f"a save read back a version it did not publish: {edits}"
    return edits


def settle(deployment, edits, records):
    """After ``edits``: the version in Redis is the last edit's (or one announced after it),
    and every worker comes to decide on it (the requests appended to ``records``)."""
    stored = deployment.stored_version()
    order = version_order(edits)
    assert order(stored) >= order(edits[-1].version), \
        f"the version in Redis went back from {edits[-1].version} to {stored}"
    converge(deployment, records)
    print(f"\n{len(records)} requests ({sum(r.status == 429 for r in records)} refused) by "
          f"worker: {by_worker(records)}")


@pytest.mark.parametrize("threads, pause_s", [(1, 0.5), (LOAD_THREADS, 0.0)],
                         ids=["light", "load"])
def test_no_request_after_an_edit_is_decided_on_older_rules(deployment, threads, pause_s):
    records = []
    with Traffic(deployment.server, threads, pause_s, records):
        edits = run_edits(deployment)
    settle(deployment, edits, records)
    assert_decided(records)
    assert_never_older(records, edits)
    assert_never_ahead(records, edits)


# --- a dated override --------------------------------------------------------------------------

def override_problem(record, starts, ends):
    """Return what is wrong with ``record`` for an override from ``starts`` to ``ends``, or
    "" (a request is judged from GRACE_S after each moment)."""
    overridden = record.burst == OVERRIDE_BURST
    if overridden and record.ended < starts:
        return "the override's numbers before its start"
    if not overridden and record.started >= starts + GRACE_S and record.ended < ends:
        return "the rule's own numbers after the start"
    if overridden and record.started >= ends + GRACE_S:
        return "the override's numbers after its end"
    return ""


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_a_dated_override_switches_at_its_moments(deployment, busy):
    output = python(["-c", OVERRIDE, str(OVERRIDE_LEAD_S), str(OVERRIDE_LENGTH_S)],
                    deployment.env)
    moments = json.loads(output)
    starts, ends = moments["starts_at"], moments["ends_at"]
    # idle: no request for more than 2 s before each moment (the last one came before the
    # override was created), then requests from the moment on
    before_s, threads = (AROUND_S, LOAD_THREADS) if busy else (0.0, 4)
    records = []
    for moment in (starts, ends):
        traffic_between(deployment.server, threads, moment - before_s, moment + AROUND_S,
                        records)
    assert_decided(records)
    wrong = [f"{problem}: started {(r.started - starts) * 1000:+.0f} ms and ended "
             f"{(r.ended - starts) * 1000:+.0f} ms from the start, worker {r.worker}, q={r.burst}"
             for r in records if (problem := override_problem(r, starts, ends))]
    during = {r.worker for r in records if starts + GRACE_S <= r.started and r.ended < ends}
    print(f"\n{len(records)} requests, {sum(r.burst == OVERRIDE_BURST for r in records)} with "
          f"the override's numbers; {len(during)} workers answered between its moments")
    assert not wrong, f"{len(wrong)} of {len(records)} requests:\n" + "\n".join(wrong[:10])
    assert during, "no request was decided between the start and the end"
    assert any(r.started >= ends + GRACE_S for r in records)
    if busy:
        assert any(r.ended < starts for r in records)


# --- a change without a signal -----------------------------------------------------------------

def test_an_outside_change_is_found_without_traffic_and_recorded_once(deployment):
    # every worker on the stored version, whichever test of the module ran before this one (a
    # worker that still holds that test's rules may set the emptied version key forwards)
    converge(deployment, [])
    # a dated override ahead: the rules have a moment to switch at
    python(["-c", OVERRIDE, "3600", "60"], deployment.env)
    changed = json.loads(python(["-c", OUTSIDE_UPDATE], deployment.env))
    deadline = changed["at"] + RELOAD_INTERVAL_S + 1.0

    # no request at all: only the workers' own threads can find the change
    poll_until(lambda: deployment.stored_version() != changed["version"],
               deadline - time.time(),
               f"a new config version within {RELOAD_INTERVAL_S} s + 1 s of the update")
    version = deployment.stored_version()
    print(f"\nannounced {(time.time() - changed['at']) * 1000:.0f} ms after the update")

    published = Published(time.time(), changed["burst"], version)
    first = send(deployment.server)
    assert (first.status, first.version, first.burst) == (200, version, changed["burst"])
    records = [first]
    converge(deployment, records, version)
    assert_decided(records)
    assert_never_older(records, [published])

    entries = json.loads(python(["-c", AUDIT_ENTRIES, str(changed["last_entry"])],
                                deployment.env))
    assert [(e["source"], e["actor"]) for e in entries] == [("outside", "outside the app")]
    [change] = entries[0]["diff"]
    assert (change["action"], change["label"], change["fields"]) == \
        ("change", "rule “live-ip”", {"burst": [changed["burst"] - 1, changed["burst"]]})


WATCHING = re.compile(r"process (\d+) watches the quota configuration")


@pytest.mark.parametrize("kind", SERVERS)
def test_an_outside_change_is_found_by_workers_that_never_served(kind, tmp_path, redis_server,
                                                                  database_env):
    # a server of its own: the module's has served requests in other tests
    server_class, workers = SERVERS[kind]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.config.propagation_settings",
           "RELOAD_INTERVAL_S": str(RELOAD_INTERVAL_S), **database_env(tmp_path),
           "REDIS_URL": redis_server.url, "DJANGO_DEBUG": "0", "RATELIMIT_LOG_LEVEL": "INFO"}
    python(["manage.py", "migrate", "--verbosity", "0"], env)
    python(["-c", SETUP], env)
    python(["-c", OVERRIDE, "3600", "60"], env)  # dated rows present
    server = server_class(env, tmp_path, workers=workers).start()  # polls /health/: exempt
    try:
        # every worker compiled its rules and watches, without a limited request
        poll_until(lambda: len(set(WATCHING.findall(server.log()))) == workers, 15,
                   f"{workers} workers watching:\n{server.log()}")
        version = (redis_server.client().get(VERSION_KEY) or b"").decode()
        changed = json.loads(python(["-c", OUTSIDE_UPDATE], env))
        poll_until(lambda: (redis_server.client().get(VERSION_KEY) or b"").decode() != version,
                   changed["at"] + RELOAD_INTERVAL_S + 1.0 - time.time(),
                   f"a new config version within {RELOAD_INTERVAL_S} s + 1 s of the update")
        entries = json.loads(python(["-c", AUDIT_ENTRIES, str(changed["last_entry"])], env))
        assert [e["source"] for e in entries] == ["outside"]  # recorded once
        assert entries[0]["diff"][0]["fields"] == \
            {"burst": [changed["burst"] - 1, changed["burst"]]}
    finally:
        stop_server(server)


# --- edits while the client is refused (last: it leaves live-ip starved) -----------------------

def test_no_refusal_after_an_edit_comes_from_older_rules(deployment):
    """A refused client's requests are answered from the workers' local deny cache, without
    Redis, so without the fence: a worker drops it as soon as its watcher sees a new version,
    so such a refusal on older rules comes within LOCAL_REFUSALS_S of a publication, never
    later."""
    starved = Published(**json.loads(python(["-c", STARVE, "3"], deployment.env)))
    records = []
    with Traffic(deployment.server, LOAD_THREADS, records=records):
        poll_until(lambda: sum(r.status == 429 for r in records) >= 50, 10, "refusals")
        edits = run_edits(deployment)
    settle(deployment, edits, records)
    assert_decided(records)
    assert_never_older(records, [starved, *edits], local_refusals_s=LOCAL_REFUSALS_S)
