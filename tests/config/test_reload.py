"""Every edit applies, however it was made (policy.PolicyCache's comparison of the rows,
``reload_config``, ``manage.py ratelimit reload``, signals on loaddata and queryset deletes).

In process, with the Limiter's test clock: a worker compares a digest of the quota rows with
its snapshot once every CONFIG_RELOAD_INTERVAL_S, so rows changed without a signal are served
at most that long after the change, and no request in between queries the database. Inside a
test's transaction ``on_commit`` hooks do not run, so nothing here is announced by a signal
unless the test's database commits for real (``django_db(transaction=True)``).
"""

import io
import json
import logging
import os
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser
from django.core.checks import run_checks
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

import ratelimit_app
from ratelimit_app.config import compiler
from ratelimit_app.config.fingerprint import config_fingerprint
from ratelimit_app.config.policy import ANNOUNCE_GRACE_S, PolicyCache
from ratelimit_app.config.snapshot import Snapshot
from ratelimit_app.models import EndpointCost, IdentityOverride, Plan, Rule, Scope
from ratelimit_app.runtime.limiter import Limiter

from ..helpers import commands_sent, limiter, poll_until, use_fake_clock

pytestmark = pytest.mark.django_db

INTERVAL_S = 30
HUGE = 1_000_000  # a burst the test's own decisions cannot exhaust


@pytest.fixture
def clock(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_RELOAD_INTERVAL_S": INTERVAL_S}
    return use_fake_clock()


@pytest.fixture
def plan(clock):
    """The anonymous plan with one per-IP rule on `hello`, compiled into the worker's snapshot
    (at the clock's start: the worker next compares the rows INTERVAL_S later)."""
    free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="free-ip", plan=free, scope=Scope.IP, endpoint="hello", rate=1,
                        period_s=60, burst=HUGE)
    assert bursts() == {"free-ip": HUGE}
    return free


def bursts(worker=None):
    """Decide one request to `hello` and return the burst of each policy it was decided by."""
    request = RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.7")
    decision = (worker or limiter()).decide(request, AnonymousUser(), "hello")
    return {policy.name: policy.burst for policy in decision.policies}


def fingerprint_queries(captured):
    return [q for q in captured.captured_queries if "fingerprint_0" in q["sql"]]


def database_work(captured):
    """The captured queries apart from the savepoint the fingerprint query runs in."""
    return [q for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]


def step_past_the_interval(clock):
    clock.advance(INTERVAL_S * 1000 + 1)


# --- rows changed without a signal are served within the interval ---------------------------

def test_an_update_is_served_after_the_interval_with_no_query_per_request_before(plan, clock):
    Rule.objects.filter(name="free-ip").update(burst=9)  # no signal, no announcement

    with CaptureQueriesContext(connection) as captured:
        for _ in range(300):  # 300 requests over 29.7 s: the old rules, from memory
            clock.advance(99)
            assert bursts() == {"free-ip": HUGE}
    assert captured.captured_queries == []

    clock.advance(INTERVAL_S * 1000 - 300 * 99)  # the interval is over
    version_before = limiter().read_version()
    with CaptureQueriesContext(connection) as captured:
        assert bursts() == {"free-ip": 9}  # served by this very request
    # the comparison, then the reload's own digest of the rows it compiles
    assert len(fingerprint_queries(captured)) == 2
    # and every other worker is told: a new config version
    assert limiter().read_version() != version_before


def test_unchanged_rows_cost_one_query_per_interval(plan, clock):
    with CaptureQueriesContext(connection) as captured:
        for _ in range(4 * INTERVAL_S):  # a request a second for four intervals
            clock.advance(1000)
            bursts()
    assert len(fingerprint_queries(captured)) == len(database_work(captured)) == 4


def test_bulk_create_is_served_after_the_interval(plan, clock):
    Rule.objects.bulk_create([Rule(name="bulk-ip", plan=plan, scope=Scope.IP, endpoint="hello",
                                   rate=1, period_s=60, burst=HUGE - 1)])
    assert bursts() == {"free-ip": HUGE}
    step_past_the_interval(clock)
    assert bursts() == {"free-ip": HUGE, "bulk-ip": HUGE - 1}


def test_raw_sql_is_served_after_the_interval(plan, clock):
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Rule._meta.db_table} SET burst = %s WHERE name = %s",
                       [7, "free-ip"])
    assert bursts() == {"free-ip": HUGE}
    step_past_the_interval(clock)
    assert bursts() == {"free-ip": 7}


def test_a_raw_sql_delete_is_served_after_the_interval(plan, clock):
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {Rule._meta.db_table} WHERE name = %s", ["free-ip"])
    step_past_the_interval(clock)
    assert bursts() == {}


def test_an_update_of_a_plan_or_a_cost_is_noticed_too(plan, clock):
    # the plan is no longer the anonymous default: its rules stop applying
    Plan.objects.filter(pk=plan.pk).update(default_for_anonymous=False)
    step_past_the_interval(clock)
    assert bursts() == {}


def test_a_worker_that_notices_tells_the_others_before_their_own_interval(plan, clock):
    clock.advance(20_000)
    other = Limiter.from_settings(clock, metrics_autostart=False)  # compares 20 s later
    try:
        assert bursts(other) == {"free-ip": HUGE}
        Rule.objects.filter(name="free-ip").update(burst=9)
        clock.advance(INTERVAL_S * 1000 - 20_000 + 1)  # this worker's interval is over
        assert bursts() == {"free-ip": 9}
        announced = limiter().read_version()
        # the other worker's next reply carries the new version; the request after serves it
        bursts(other)
        assert bursts(other) == {"free-ip": 9}
        # at its own interval it finds the rows it holds: no second announcement
        clock.advance(20_000)
        assert bursts(other) == {"free-ip": 9}
        assert limiter().read_version() == announced
    finally:
        other.close()


def test_workers_noticing_the_same_change_announce_it_once(plan, clock):
    other = Limiter.from_settings(clock, metrics_autostart=False)
    try:
        assert bursts(other) == {"free-ip": HUGE}
        Rule.objects.filter(name="free-ip").update(burst=9)
        step_past_the_interval(clock)
        assert bursts() == {"free-ip": 9}
        announced = limiter().read_version()
        # the other worker sees the rows differ too, but the version has moved on already
        with CaptureQueriesContext(connection) as captured:
            snapshot = other.snapshot()
        assert snapshot.version == announced == limiter().read_version()
        assert len(fingerprint_queries(captured)) == 2
    finally:
        other.close()


def test_an_update_to_the_same_value_reloads_nothing(plan, clock):
    Rule.objects.filter(name="free-ip").update(burst=HUGE)
    version = limiter().read_version()
    step_past_the_interval(clock)
    with CaptureQueriesContext(connection) as captured:
        bursts()
    assert len(database_work(captured)) == len(fingerprint_queries(captured)) == 1
    assert limiter().read_version() == version


def test_a_failed_comparison_keeps_the_rules_and_is_retried_next_interval(plan, clock, caplog):
    table = EndpointCost._meta.db_table
    Rule.objects.filter(name="free-ip").update(burst=9)
    with connection.cursor() as cursor:  # (SQLite: undone with the test's transaction)
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_away")
    step_past_the_interval(clock)
    with caplog.at_level(logging.ERROR, logger="ratelimit_app"):
        assert bursts() == {"free-ip": HUGE}  # served, from the rules in memory
    assert "could not compare the quota rows" in caplog.text
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table}_away RENAME TO {table}")
    clock.advance(1000)
    assert bursts() == {"free-ip": HUGE}  # not before the next interval
    step_past_the_interval(clock)
    assert bursts() == {"free-ip": 9}


def test_the_async_path_compares_in_a_thread(plan, clock):
    Rule.objects.filter(name="free-ip").update(burst=9)
    step_past_the_interval(clock)
    assert limiter().policies.current() is None  # due: not served from the loop as it is
    request = RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.8")

    async def adecide():
        try:
            return await limiter().adecide(request, AnonymousUser(), "hello")
        finally:
            await limiter().async_store().aclose()

    decision = async_to_sync(adecide)()
    assert {p.name: p.burst for p in decision.policies} == {"free-ip": 9}


@pytest.mark.parametrize("off", [0, None])
def test_turned_off_nothing_is_queried_and_reload_config_applies(plan, clock, settings, off):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_RELOAD_INTERVAL_S": off}
    assert bursts() == {"free-ip": HUGE}  # a new Limiter from the new settings
    Rule.objects.filter(name="free-ip").update(burst=9)
    with CaptureQueriesContext(connection) as captured:
        for _ in range(100):
            clock.advance(3_600_000)  # a hundred hours
            assert bursts() == {"free-ip": HUGE}
    assert captured.captured_queries == []
    version = ratelimit_app.reload_config()
    assert limiter().read_version() == version
    assert bursts() == {"free-ip": 9}


def test_one_thread_compares_while_the_others_serve_the_rules_in_memory():
    now = [0.0]
    comparing, release = threading.Event(), threading.Event()
    digests = iter(["rows-1", "rows-1"])

    def fingerprint():  # the database's part, held while the other threads ask
        digest = next(digests)
        if now[0] > 0:
            comparing.set()
            assert release.wait(10)
        return digest

    cache = PolicyCache(lambda: "v1", check_interval_s=3600, clock=lambda: now[0],
                        load=Snapshot, reload_interval_s=INTERVAL_S, fingerprint=fingerprint)
    snapshot = cache.get()
    now[0] = INTERVAL_S + 1
    first = threading.Thread(target=cache.get)
    first.start()
    assert comparing.wait(10)
    # while the first thread compares: no second comparison, no waiting
    others = [cache.get() for _ in range(50)]
    release.set()
    first.join(10)
    assert all(other is snapshot for other in others)
    # exactly two digests were taken: the load's and one comparison
    assert next(digests, "none left") == "none left"
    assert cache.get() is snapshot and cache.compare_at == 2 * INTERVAL_S + 1



class HeldFingerprint:
    """A ``fingerprint`` for PolicyCache: the first load's digest at once, then each one held
    until ``release``, recording the thread that asked."""

    def __init__(self, digests):
        self.digests = iter(digests)
        self.loaded = False
        self.comparing, self.release = threading.Event(), threading.Event()
        self.threads, self.priorities = [], []

    def __call__(self):
        if self.loaded:
            self.threads.append(threading.current_thread().name)
            self.priorities.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            self.comparing.set()
            assert self.release.wait(10)
        self.loaded = True
        return next(self.digests)


def comparing_in_a_thread(fingerprint):
    """A PolicyCache with its watcher, its snapshot loaded and the comparison due; returns
    (cache, snapshot)."""
    now = [0.0]
    cache = PolicyCache(lambda: "v1", check_interval_s=3600, clock=lambda: now[0],
                        load=Snapshot, reload_interval_s=INTERVAL_S, fingerprint=fingerprint,
                        in_threads=True)
    snapshot = cache.get()
    now[0] = INTERVAL_S + 1
    return cache, snapshot


def test_the_watcher_compares_the_rows_without_a_request_and_requests_do_not_wait():
    fingerprint = HeldFingerprint(["rows-1", "rows-2", "rows-2"])
    cache, snapshot = comparing_in_a_thread(fingerprint)
    try:
        # no request comes: the watcher finds the comparison due by itself
        assert fingerprint.comparing.wait(10)
        # the comparison is held in the database: requests are served meanwhile, on both
        # paths (current() is the event loop's)
        assert [cache.get() for _ in range(50)] == [snapshot] * 50
        assert cache.current() is snapshot
        assert fingerprint.threads == ["ratelimit-config-watcher"]
        assert cache.compare_at == 2 * INTERVAL_S + 1  # the next one is due an interval later
        fingerprint.release.set()
        # the rows differ: the watcher reloads, no request needed
        poll_until(lambda: cache.snapshot is not snapshot, timeout_s=10,
                   what="the reload after the comparison's verdict")
        assert cache.get() is cache.snapshot and not cache.stale
        # one comparison, then the reload's digest, both in the watcher, at normal priority
        assert fingerprint.threads == ["ratelimit-config-watcher"] * 2
        assert fingerprint.priorities == [0, 0]
    finally:
        cache.close()
    assert not cache.watching


def test_the_event_loop_serves_the_rules_in_memory_while_the_watcher_compares():
    fingerprint = HeldFingerprint(["rows-1", "rows-1"])
    fingerprint.release.set()
    cache, snapshot = comparing_in_a_thread(fingerprint)
    try:
        assert cache.current() is snapshot  # not None: no thread of the loop's is needed
        assert fingerprint.comparing.wait(10)
        poll_until(lambda: not cache._compare_lock.locked() and fingerprint.threads,
                   timeout_s=10, what="the comparison to finish")
        assert not cache.stale and cache.current() is snapshot  # the same rows
    finally:
        cache.close()


@pytest.mark.django_db(transaction=True)
def test_a_server_limiter_compares_in_its_thread_and_serves_an_update(settings):
    """A Limiter as a server builds it (background threads on, the system clock), on rows
    committed for real: the comparison thread's own connection sees them."""
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_RELOAD_INTERVAL_S": 1}
    free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="free-ip", plan=free, scope=Scope.IP, endpoint="hello", rate=1,
                        period_s=60, burst=HUGE)
    worker = Limiter.from_settings()
    try:
        assert bursts(worker) == {"free-ip": HUGE}
        Rule.objects.filter(name="free-ip").update(burst=9)
        with CaptureQueriesContext(connection) as captured:
            poll_until(lambda: bursts(worker) == {"free-ip": 9}, timeout_s=10,
                       what="the update to be served")
        # the comparison and the reload ran in their threads: this one queried nothing
        assert database_work(captured) == []
        assert worker.policies.watching
    finally:
        worker.close()


class HeldLoad:
    """A ``load`` for PolicyCache: the first snapshot at once, then each one held until
    ``release``, recording the thread that compiled it."""

    def __init__(self):
        self.loaded = False
        self.loading, self.release = threading.Event(), threading.Event()
        self.threads = []

    def __call__(self, version):
        if self.loaded:
            self.threads.append(threading.current_thread().name)
            self.loading.set()
            assert self.release.wait(10)
        self.loaded = True
        return Snapshot(version=version)


def reloading_in_a_thread(versions):
    """A PolicyCache with threads whose load is held; returns (cache, load, first snapshot).
    ``versions`` is the store's version, a one-item list the test changes."""
    load = HeldLoad()
    cache = PolicyCache(lambda: versions[0], check_interval_s=3600, clock=lambda: 0.0,
                        load=load, in_threads=True)
    return cache, load, cache.get()


def test_a_new_version_is_compiled_in_a_thread_while_requests_keep_the_rules_in_memory():
    versions = ["v1"]
    cache, load, snapshot = reloading_in_a_thread(versions)
    try:
        versions[0] = "v2"
        cache.observe_version("v2")  # what a reply from the store carries after an edit
        # the compile is held in the database: every request is served meanwhile, the one
        # that found the snapshot stale included, on both paths (current() is the event loop's)
        assert cache.get() is snapshot
        assert load.loading.wait(10)
        assert [cache.get() for _ in range(50)] == [snapshot] * 50
        assert cache.current() is snapshot
        assert load.threads == ["ratelimit-config-watcher"]  # one compile, in the watcher
        load.release.set()
        poll_until(lambda: cache.get().version == "v2", timeout_s=10, what="the new rules")
        assert load.threads == ["ratelimit-config-watcher"] and not cache.stale
    finally:
        cache.close()
    assert not cache.watching


def test_the_watcher_compiles_a_new_version_before_any_request_asks():
    versions = ["v1"]
    cache, load, snapshot = reloading_in_a_thread(versions)
    load.release.set()
    try:
        versions[0] = "v2"  # published by another process; no reply, no request here
        poll_until(lambda: cache.snapshot.version == "v2", timeout_s=10,
                   what="the watcher to compile v2")
        assert load.threads == ["ratelimit-config-watcher"] and not cache.stale
        assert cache.get().version == "v2"
    finally:
        cache.close()


def test_a_request_the_fence_refused_gets_the_rules_the_watcher_compiles():
    """fresh(): a compile under way is waited for, not done twice."""
    versions = ["v1"]
    cache, load, snapshot = reloading_in_a_thread(versions)
    try:
        versions[0] = "v2"
        assert load.loading.wait(10)  # the watcher compiles v2 (held in the database)
        fresh = []
        waiting = threading.Thread(target=lambda: fresh.append(cache.fresh(snapshot)))
        waiting.start()
        load.release.set()
        waiting.join(10)
        assert fresh[0].version == "v2" and fresh[0] is cache.snapshot
        assert load.threads == ["ratelimit-config-watcher"]  # compiled once, by the watcher
    finally:
        cache.close()


def test_an_edit_made_in_this_process_is_compiled_in_the_request_that_follows():
    """The process that saved serves its edit at once (the admin's next page, the simulator)."""
    versions = ["v1"]
    cache, load, snapshot = reloading_in_a_thread(versions)
    load.release.set()
    try:
        versions[0] = "v2"
        cache.invalidate()  # what bump_config_version does on an admin save's commit
        reloaded = cache.get()
        assert reloaded is not snapshot and reloaded.version == "v2"
        assert load.threads == [threading.current_thread().name]
        # a later change learnt from the store goes to the watcher
        versions[0] = "v3"
        cache.observe_version("v3")
        poll_until(lambda: cache.get().version == "v3", timeout_s=10, what="the v3 rules")
        assert load.threads[-1] == "ratelimit-config-watcher"
    finally:
        cache.close()


def test_an_edit_made_here_while_the_thread_reloads_is_reloaded_after_it():
    """The thread may have read the rows before this process's edit committed: its snapshot
    must not pass for the edit's."""
    versions = ["v1"]
    cache, load, snapshot = reloading_in_a_thread(versions)
    try:
        versions[0] = "v2"
        cache.observe_version("v2")
        assert cache.get() is snapshot
        assert load.loading.wait(10)  # the thread has read version v2 and holds the rows
        versions[0] = "v3"
        cache.invalidate()  # an admin save in this process commits meanwhile
        load.release.set()
        # the watcher's v2 is never served as the edit's: the next request has v3 (compiled
        # by the request itself, or by the watcher, which has seen v3 by then)
        poll_until(lambda: load.threads[1:] or cache.snapshot.version == "v2",
                   timeout_s=10, what="the watcher's reload")
        assert cache.get().version == "v3"
        assert load.threads[0] == "ratelimit-config-watcher" and len(load.threads) == 2
        assert not cache.stale
    finally:
        cache.close()


def test_a_failed_reload_in_the_thread_keeps_the_rules_in_memory(caplog):
    versions = ["v1"]
    loads = iter([Snapshot(version="v1"), RuntimeError("the database is gone"),
                  Snapshot(version="v2")])

    def load(version):
        loaded = next(loads)
        if isinstance(loaded, Exception):
            raise loaded
        return loaded

    now = [0.0]
    cache = PolicyCache(lambda: versions[0], check_interval_s=5, clock=lambda: now[0],
                        load=load, in_threads=True)
    snapshot = cache.get()
    try:
        versions[0] = "v2"
        cache.observe_version("v2")
        assert cache.get() is snapshot
        poll_until(lambda: cache.retry_at == 5, timeout_s=10, what="the failed reload")
        assert "could not load the quota configuration" in caplog.text
        assert cache.get() is snapshot  # the rules in memory, until the next poll's retry
        now[0] = 6
        cache.observe_version("v2")
        poll_until(lambda: cache.get().version == "v2", timeout_s=10, what="the retried reload")
    finally:
        cache.close()


# --- what announces at once ---------------------------------------------------------------

def test_reload_config_makes_every_worker_reload(plan, clock):
    other = Limiter.from_settings(clock, metrics_autostart=False)
    try:
        assert bursts(other) == {"free-ip": HUGE}
        Rule.objects.filter(name="free-ip").update(burst=9)
        version = ratelimit_app.reload_config()
        assert version == limiter().read_version()
        assert bursts() == {"free-ip": 9}  # this process: at once
        bursts(other)  # the other: its next reply carries the version
        assert bursts(other) == {"free-ip": 9}
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)  # the delete's transaction really commits
def test_a_queryset_delete_is_announced_by_the_signals(plan, clock):
    version = limiter().read_version()
    Rule.objects.filter(name="free-ip").delete()  # post_delete for each row
    assert limiter().read_version() != version
    assert bursts() == {}  # no wait for the interval


@pytest.mark.django_db(transaction=True)  # loaddata's own transaction really commits
def test_loaddata_of_many_rows_announces_one_new_version(plan, clock, tmp_path, redis_client):
    """loaddata saves rows raw (post_save with raw=True) in one transaction: announced once, at
    its commit, not once per row (each bump is a reload of every worker)."""
    loaded = {f"fixture-ip-{i}": 5 + i for i in range(6)}
    fixture = tmp_path / "rules.json"
    fixture.write_text(json.dumps([{"model": "ratelimit_app.rule", "pk": 900 + i, "fields": {
        "name": name, "plan": plan.pk, "scope": "ip", "endpoint": "hello", "rate": 1,
        "period_s": 60, "burst": burst, "updated": "2026-01-01T00:00:00Z"}}
        for i, (name, burst) in enumerate(loaded.items())]))
    other = Limiter.from_settings(clock, metrics_autostart=False)  # a worker holding the old rows
    try:
        assert bursts(other) == {"free-ip": HUGE}
        version = limiter().read_version()
        with commands_sent(redis_client) as sent:
            call_command("loaddata", str(fixture), stdout=io.StringIO())
        new_version = limiter().read_version()
        version_key = limiter().version_key
        assert [c for c in sent if version_key in c and not c.startswith("get ")] == \
            [f"set {version_key} {new_version}"]
        assert new_version != version
        assert bursts() == {"free-ip": HUGE, **loaded}  # this process: at once
        bursts(other)  # the other: its next reply carries the version
        assert bursts(other) == {"free-ip": HUGE, **loaded}
    finally:
        other.close()


def test_the_reload_command_announces_and_says_what_workers_now_hold(plan, clock):
    EndpointCost.objects.create(endpoint="hello", cost=2)
    previous = limiter().read_version()
    out = io.StringIO()
    call_command("ratelimit", "reload", stdout=out)
    version = limiter().read_version()
    assert out.getvalue().splitlines() == [
        f"Config version {previous} -> {version}: every worker reloads the quota rows within "
        f"about a second.",
        "They now hold 1 enabled rule(s), 1 plan(s), 1 endpoint cost(s), 0 active API key(s).",
    ]


def test_the_reload_command_fails_when_redis_is_down(plan, redis_server):
    redis_server.kill()
    with pytest.raises(CommandError) as failed:
        call_command("ratelimit", "reload", stdout=io.StringIO())
    assert failed.value.returncode == 1
    assert "workers were not told to reload" in str(failed.value)


# --- the digest ----------------------------------------------------------------------------

def test_the_fingerprint_changes_with_any_change_of_a_row_and_only_then(plan):
    rule = Rule.objects.get(name="free-ip")
    seen = [config_fingerprint()]
    assert config_fingerprint() == seen[0]  # stable

    def changed():
        seen.append(config_fingerprint())
        return seen[-1] not in seen[:-1]

    Rule.objects.filter(pk=rule.pk).update(mode="shadow")
    assert changed()
    Rule.objects.filter(pk=rule.pk).update(endpoint="")
    assert changed()
    override = IdentityOverride.objects.create(ip="192.0.2.1", exempt=True)
    assert changed()
    IdentityOverride.objects.filter(pk=override.pk).update(reason="")  # same value: same digest
    assert not changed()
    # one row out, another in: the same count, another digest
    IdentityOverride.objects.filter(pk=override.pk).delete()
    IdentityOverride.objects.create(ip="192.0.2.2", exempt=True)
    assert changed()
    # a column moved between rows (NULL and '' kept apart)
    Plan.objects.create(slug="pro", name="Pro", description="")
    assert changed()
    Plan.objects.filter(slug="pro").update(description="x")
    assert changed()


def test_the_comparison_threads_digest_in_chunks_is_the_same_digest(plan, monkeypatch):
    """The thread's digest (read and hashed in chunks, pausing between them) equals the
    request path's, over rows spanning several chunks, and changes with a row of a later one."""
    Rule.objects.bulk_create(
        Rule(name=f"many-{i}", plan=plan, scope=Scope.IP, endpoint="hello", rate=1,
             period_s=60, burst=HUGE) for i in range(2 * compiler.FINGERPRINT_CHUNK_ROWS + 50))
    pauses = []
    monkeypatch.setattr(compiler.time, "sleep", pauses.append)
    whole = config_fingerprint()
    assert pauses == []  # the request path's digest never sleeps
    assert config_fingerprint(pause_s=0.001) == whole
    assert len(pauses) >= 3 and set(pauses) == {0.001}  # >= 3 chunks, each read and hashed
    last = Rule.objects.order_by("pk").last()
    Rule.objects.filter(pk=last.pk).update(burst=9)
    assert config_fingerprint(pause_s=0.001) == config_fingerprint() != whole


def test_the_reload_threads_compile_in_chunks_is_the_same_snapshot(plan, monkeypatch):
    """The reload thread's compile (pausing after every chunk of rows it builds) gives the
    snapshot the request path's gives, over rows spanning several chunks of several tables."""
    chunk = compiler.FINGERPRINT_CHUNK_ROWS
    Rule.objects.bulk_create(
        Rule(name=f"many-{i}", plan=plan, scope=Scope.IP, endpoint=f"e{i}", rate=1 + i,
             period_s=60, burst=HUGE) for i in range(2 * chunk + 10))
    EndpointCost.objects.bulk_create(
        EndpointCost(endpoint=f"e{i}", plan=plan, cost=1 + i % 7) for i in range(chunk + 5))
    IdentityOverride.objects.bulk_create(
        IdentityOverride(ip=f"192.0.2.{i}", exempt=i % 2 == 0, burst=None if i % 2 == 0 else 5)
        for i in range(1, chunk + 5))
    pauses = []
    monkeypatch.setattr(compiler.time, "sleep", pauses.append)
    now = 1_800_000_000.0
    whole = compiler.compile_snapshot("v1", now)
    assert pauses == []  # the request path's compile never sleeps
    paced = compiler.compile_snapshot("v1", now, pause_s=0.001)
    assert paced == whole and len(paced.rules) == 2 * chunk + 11 and len(paced.costs) == chunk + 5
    # rules: 2 chunks, costs and overrides: 1 each (the plan's one row and the rest: none)
    assert len(pauses) == 4 and set(pauses) == {0.001}


# --- the setting -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["30", True, -1, 0.5, float("nan"), float("inf")])
def test_an_invalid_interval_is_reported_and_the_default_applies(settings, value):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_RELOAD_INTERVAL_S": value}
    errors = [e for e in run_checks() if e.id == "ratelimit_app.E010"]
    assert len(errors) == 1 and repr(value) in errors[0].msg
    assert limiter().policies.reload_interval_s == 30


@pytest.mark.parametrize("value", [1, 30, 2.5, 0, None])
def test_a_valid_interval_passes_the_check(settings, value):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_RELOAD_INTERVAL_S": value}
    assert not [e for e in run_checks() if e.id == "ratelimit_app.E010"]
    assert limiter().policies.reload_interval_s == (float(value) if value else None)


@pytest.mark.parametrize("value", ["0.05", True, 0, -1, 0.001, 60, float("nan")])
def test_an_invalid_watch_interval_is_reported_and_the_default_applies(settings, value):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_WATCH_INTERVAL_S": value}
    errors = [e for e in run_checks() if e.id == "ratelimit_app.E011"]
    assert len(errors) == 1 and repr(value) in errors[0].msg
    assert limiter().policies.watch_interval_s == 0.05


@pytest.mark.parametrize("value", [0.01, 0.05, 1, 10])
def test_a_valid_watch_interval_passes_the_check(settings, value):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_WATCH_INTERVAL_S": value}
    assert not [e for e in run_checks() if e.id == "ratelimit_app.E011"]
    assert limiter().policies.watch_interval_s == value


# --- an edit's own publication, on its way when a comparison sees its rows ----------------------

def comparing_watcher(versions, digests, announced):
    """A PolicyCache with its watcher (not started: the test runs its comparison) whose rows'
    digest is ``digests[0]`` and whose store's version ``versions[0]``; its announcements are
    appended to ``announced``."""
    def announce(superseded, parts):
        announced.append(parts)
        versions[0] = f"announced-{len(announced)}"
        return True

    return PolicyCache(lambda: versions[0], check_interval_s=3600, clock=lambda: 0.0,
                       load=lambda version, at=None: Snapshot(version=version),
                       reload_interval_s=INTERVAL_S, fingerprint=lambda: dict(digests[0]),
                       announce=announce, in_threads=True)


def test_rows_whose_publication_comes_during_the_grace_are_not_an_outside_change():
    """A save() commits, then publishes: a comparison in that moment sees the new rows with
    the old version. It waits for the publication and announces nothing (no second version,
    no "outside" entry in the audit trail)."""
    versions, digests, announced = ["v1"], [{"rule": "a"}], []
    cache = comparing_watcher(versions, digests, announced)
    try:
        snapshot = cache.get()
        digests[0] = {"rule": "b"}  # the edit committed...
        polled = []

        def publication_on_its_way():
            if len(polled) == 2:
                versions[0] = "v2"  # ...and its publication lands a moment later
            polled.append(versions[0])
            return versions[0]

        cache._poll_store = publication_on_its_way
        cache._compare_with(snapshot)
        assert announced == [] and cache.stale  # the new version's rules are compiled next
        assert polled == ["v1", "v1", "v2"]  # it waited for it, and no longer
    finally:
        cache.close()


def test_rows_changed_with_no_publication_are_announced_after_the_grace():
    versions, digests, announced = ["v1"], [{"rule": "a", "plan": "p"}], []
    cache = comparing_watcher(versions, digests, announced)
    try:
        snapshot = cache.get()
        digests[0] = {"rule": "b", "plan": "p"}  # a queryset update(): nothing published
        started = time.monotonic()
        cache._compare_with(snapshot)
        assert announced == [{"rule"}] and versions[0] == "announced-1"
        assert time.monotonic() - started >= ANNOUNCE_GRACE_S
    finally:
        cache.close()
