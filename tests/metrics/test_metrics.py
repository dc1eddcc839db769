"""The metrics package: in-process counting, the hot-key sketch, the flush to Redis and the
reads back."""

import io
import logging
import os
import random
import threading
import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings

from ratelimit_app import metrics
from ratelimit_app.decision.buckets import PolicyStatus
from ratelimit_app.decision.engine import Decision
from ratelimit_app.decision.identity import Identity
from ratelimit_app.metrics import Flusher, Recorder, SpaceSaving
from ratelimit_app.runtime.limiter import Limiter, default_limiter
from ratelimit_app.stores import StoreUnavailable

from ..helpers import commands_sent, limiter

T0 = 1_700_000_040.0  # unix seconds, 0 s into a minute


class FakeClock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


def suite_redis():
    """The client the suite's own Limiter flushes to (the store's metrics client)."""
    return limiter().store.metrics_client()


def config(**extra):
    """override_settings for RATELIMIT_APP that keeps the project's own keys."""
    return override_settings(RATELIMIT_APP={**settings.RATELIMIT_APP, **extra})


def ip_identity(ip="10.0.0.1", plan="free"):
    return Identity(kind="anonymous", display=ip, ip=ip, plan=plan)


def key_identity(key_id=7, plan="pro"):
    return Identity(kind="key", display="key rk_test_…", ip="10.0.0.9", plan=plan,
                    user_id="3", api_key_id=key_id)


def status(name, remaining=5, burst=10, short=False, shadow=False, token="ip.abc"):
    return PolicyStatus(name=name, quota=10, window_s=60, burst=burst, remaining=remaining,
                        reset_s=1, full_s=10, cost=1, shadow=shadow, short=short,
                        key=f"rl:{{{token}}}:1:{token}", level_units=remaining * 60000)


def decision(allowed=True, identity=None, policies=(), endpoint="api:items", cost=1,
             shadow=()):
    policies = tuple(policies) or (status("free-ip", short=not allowed),)
    violated = tuple(p.name for p in policies if p.short and not p.shadow)
    return Decision(allowed=allowed, policies=policies, violated=violated,
                    shadow_violations=tuple(shadow), identity=identity or ip_identity(),
                    endpoint=endpoint, cost=cost)


def hash_of(redis_client, key):
    return {k.decode(): int(v) for k, v in redis_client.hgetall(key).items()}


# --- the sketch ---------------------------------------------------------------------------------

def test_space_saving_keeps_every_heavy_hitter_within_capacity():
    rng = random.Random(7)
    sketch, truth = SpaceSaving(20), {}
    stream = [f"heavy{i}" for i in range(5) for _ in range(1000)]
    stream += [f"noise{rng.randrange(100_000)}" for _ in range(5000)]
    rng.shuffle(stream)
    for member in stream:
        sketch.add(member, 1, 1, 0)
        truth[member] = truth.get(member, 0) + 1
    assert len(sketch) == 20
    threshold = len(stream) / 20
    for member, count in truth.items():
        if count > threshold:
            weight, error = sketch.entries[member][:2]
            assert weight - error <= count <= weight  # Space-Saving's bounds
    assert {m for m, _ in sketch.top(5)} == {f"heavy{i}" for i in range(5)}


def test_space_saving_ignores_untracked_zero_weight_but_updates_tracked_stats():
    sketch = SpaceSaving(2)
    sketch.add("a", 0, 0, 1)
    assert len(sketch) == 0
    sketch.add("a", 5, 5, 0)
    sketch.add("a", 0, 0, 1)  # a denial of a tracked member is counted in its stats
    assert sketch.entries["a"] == [5, 0, 5, 1, 2]


# --- counting -----------------------------------------------------------------------------------

def test_record_counts_allowed_denied_and_shadow_by_rule_plan_and_endpoint():
    recorder = Recorder(clock=FakeClock())
    recorder.record(decision(True, policies=[status("free-ip"), status("trial", shadow=True,
                                                                       short=True)],
                             shadow=["trial"]))
    recorder.record(decision(False, endpoint="api:search"))
    counts = recorder.counts()
    assert counts["all", "", "allowed"] == 1 and counts["all", "", "denied"] == 1
    assert counts["all", "", "shadow"] == 1
    assert counts["plan", "free", "allowed"] == 1 and counts["plan", "free", "denied"] == 1
    assert counts["endpoint", "api:search", "denied"] == 1
    assert counts["rule", "free-ip", "checked"] == 2 and counts["rule", "free-ip", "denied"] == 1
    assert counts["rule", "trial", "shadow"] == 1 and ("rule", "trial", "denied") not in counts


def test_tokens_count_only_allowed_requests_and_denials_per_identity():
    recorder = Recorder(clock=FakeClock())
    for _ in range(3):
        recorder.record(decision(True, identity=key_identity(), cost=5))
    recorder.record(decision(False, identity=key_identity(), cost=5))
    pending = recorder.take_pending()[int(T0 // 60)]
    member = metrics.identity_member(key_identity())
    assert member == "key:7|pro|key rk_test_…"
    assert pending.by_tokens.entries[member][2:] == [15, 1, 4]  # tokens, denials, requests


def test_decisions_wait_in_a_queue_of_at_most_a_batch_and_are_all_counted():
    recorder = Recorder(clock=FakeClock())
    made = metrics.COUNT_BATCH * 3 + 5
    cues = []
    for _ in range(made):
        cues.append(recorder.record(decision()))
        # memory: a filled batch is counted at once
        assert len(recorder._queue) < metrics.COUNT_BATCH
    # the flush thread is checked by the first decision after each count, not by every one
    assert cues.count(True) == 4 and cues[0] and cues[metrics.COUNT_BATCH]
    assert recorder.counts()["all", "", "allowed"] == made  # the last, partial batch too
    assert len(recorder._queue) == 0


def test_the_first_decision_after_a_count_starts_the_flush_thread_if_it_is_not_running():
    with config(METRICS_FLUSH_INTERVAL_S=3600):  # no flush empties the queue meanwhile
        worker = Limiter.from_settings()  # autostart, as in a server process
    try:
        worker.record(decision())
        assert worker.flusher.running
        worker.flusher.stop()  # (as after a fork: the parent's thread is not the child's)
        for _ in range(metrics.COUNT_BATCH - 1):
            worker.record(decision())  # the last of these fills the batch: it is counted
        assert not worker.flusher.running
        worker.record(decision())
        assert worker.flusher.running
    finally:
        worker.close()
    assert not worker.flusher.running


def test_record_decision_is_off_when_metrics_are_disabled():
    with config(METRICS_ENABLED=False):
        limiter().record(decision())
    assert limiter().recorder.counts() == {}
    limiter().record(decision())
    assert limiter().recorder.counts()["all", "", "allowed"] == 1
    assert not limiter().flusher.running  # the suite keeps the background thread off


def test_hot_key_memory_is_bounded_when_an_attacker_uses_100k_identities(redis_client):
    """100 000 distinct attacker IPs and one heavy hitter: the process keeps at most
    HOT_KEYS_CAPACITY identities per sketch (and MAX_MEMBERS_MEMOISED identities' fields),
    Redis at most METRICS_HOT_KEYS_STORED per set, and the heavy hitter is ranked first with
    its exact count."""
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    heavy = ip_identity("203.0.113.7")
    with config(HOT_KEYS_CAPACITY=50, METRICS_HOT_KEYS_STORED=20):
        for i in range(100_000):
            recorder.record(decision(False, identity=ip_identity(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")))
            if i % 10 == 0:
                recorder.record(decision(False, identity=heavy))
        assert recorder.sketch_sizes() <= 2 * 50
        # the identities' metrics fields the recorder remembers are bounded too
        assert 0 < len(recorder._members) <= metrics.recorder.MAX_MEMBERS_MEMOISED
        Flusher(recorder, suite_redis, clock=clock).flush_now()
        hot = limiter().reader.hot_keys("5m", now=clock.now)
    for key in redis_client.keys("rl:m:hot*"):
        assert redis_client.zcard(key) <= 20
    top = hot["denials"][0]
    assert top["display"] == "203.0.113.7" and top["denials"] == 10_000


def test_near_limit_tracks_client_buckets_only_and_stays_capped():
    recorder = Recorder(clock=FakeClock())
    low_client = status("free-user", remaining=1, burst=10, token="key.abc")
    low_shared = status("global", remaining=0, burst=10, token="global")
    recorder.record(decision(True, identity=key_identity(), policies=[low_client, low_shared]))
    for i in range(metrics.NEAR_LIMIT_CAPACITY + 50):
        recorder.record(decision(True, identity=ip_identity(f"10.1.{i >> 8}.{i & 255}"),
                                 policies=[status("free-ip", remaining=0, burst=40)]))
    near = recorder.take_pending()[int(T0 // 60)].near
    assert len(near) == metrics.NEAR_LIMIT_CAPACITY
    assert not any(rule == "global" for _member, rule in near)


# --- flushing -----------------------------------------------------------------------------------

def test_flush_writes_per_minute_and_hourly_series_with_ttl(redis_client):
    clock = FakeClock(T0 + 59)  # the last second of a minute
    recorder = Recorder(clock=clock)
    flusher = Flusher(recorder, suite_redis, clock=clock)
    recorder.record(decision(True))
    clock.now = T0 + 61  # the next minute
    recorder.record(decision(False))
    with config(METRICS_RETENTION_S=600):
        sent = flusher.flush_now()
    assert sent > 0 and flusher.flush_now() == 0  # nothing left to send
    minute = int(T0 // 60)
    first, second = hash_of(redis_client, f"rl:m:c:{minute}"), hash_of(redis_client, f"rl:m:c:{minute + 1}")
    assert first["all||allowed"] == 1 and "all||denied" not in first
    assert second["all||denied"] == 1 and second["rule|free-ip|denied"] == 1
    assert 590 < redis_client.ttl(f"rl:m:c:{minute}") <= 600
    assert 4190 < redis_client.ttl(f"rl:m:ch:{minute // 60}") <= 4200
    assert hash_of(redis_client, f"rl:m:ch:{minute // 60}")["all||allowed"] == 1
    assert limiter().reader.totals()["all", "", "denied"] == 1
    series = limiter().reader.series(60, now=clock.now)
    assert len(series) == 60 and series[-1] == {"minute": (minute + 1) * 60, "allowed": 0,
                                                "denied": 1, "shadow": 0}
    assert series[-2]["allowed"] == 1
    assert limiter().reader.last_flush_at() == clock.now


def test_flush_adds_up_counts_from_several_flushes_and_processes(redis_client):
    clock = FakeClock()
    workers = [Recorder(clock=clock), Recorder(clock=clock)]
    for worker in workers:
        worker.record(decision(False, identity=key_identity()))
        worker.record(decision(True, identity=key_identity(), cost=3))
        Flusher(worker, suite_redis, clock=clock).flush_now()
    breakdown = limiter().reader.breakdown("5m", now=clock.now)
    assert breakdown["all"][""] == {"allowed": 2, "denied": 2}
    row = limiter().reader.hot_keys("1h", now=clock.now)["denials"][0]
    assert (row["ref"], row["tokens"], row["denials"], row["requests"]) == ("key:7", 6, 2, 4)
    assert limiter().reader.hot_keys("24h", now=clock.now)["tokens"][0]["tokens"] == 6


def test_a_name_holding_the_field_separator_is_read_back_whole(redis_client):
    """Rule, plan and endpoint names are operators' text: a "|" in one must not shift the
    outcome (fields.py writes and parses every count field)."""
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    recorder.record(decision(False, endpoint="api:a|b",
                             policies=[status("odd|rule", remaining=0, short=True)]))
    Flusher(recorder, suite_redis, clock=clock).flush_now()
    breakdown = limiter().reader.breakdown("5m", now=clock.now)
    assert breakdown["endpoint"]["api:a|b"] == {"denied": 1}
    assert breakdown["rule"]["odd|rule"] == {"checked": 1, "denied": 1}
    assert limiter().reader.totals()["rule", "odd|rule", "denied"] == 1


def test_metric_keys_have_no_hash_tag_and_no_command_touches_two_keys(redis_server, redis_client):
    """What makes the metrics work unchanged on Redis Cluster."""
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    recorder.record(decision(False, policies=[status("free-ip", remaining=0, short=True)]))
    before = redis_client.info("commandstats")
    Flusher(recorder, suite_redis, clock=clock).flush_now()
    limiter().reader.breakdown("1h", now=clock.now)
    limiter().reader.hot_keys("1h", now=clock.now)
    limiter().reader.near_limit(now=clock.now)
    after = redis_client.info("commandstats")
    used = {k.removeprefix("cmdstat_") for k in after
            if after[k]["calls"] != before.get(k, {}).get("calls", 0)} - {"info"}
    # (eval and get: the usage batch's script, whose two keys share the {usage} slot)
    assert used <= {"hincrby", "expire", "zincrby", "zremrangebyrank", "zadd", "set", "hgetall",
                    "zrange", "eval", "get"}
    written = [k.decode() for k in redis_client.keys("*")]
    assert written and all(k.startswith("rl:m:") for k in written)
    # the usage keys alone share a hash tag: the rollup's claim renames one to another
    assert all("{" not in k for k in written if not k.startswith("rl:m:{usage}:"))


def test_near_limit_sightings_are_read_back_newest_per_identity_and_rule():
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    recorder.record(decision(True, identity=key_identity(),
                             policies=[status("pro-user", remaining=3, burst=200, token="key.x")]))
    clock.now += 1
    recorder.record(decision(True, identity=key_identity(),
                             policies=[status("pro-user", remaining=2, burst=200, token="key.x")]))
    Flusher(recorder, suite_redis, clock=clock).flush_now()
    near = limiter().reader.near_limit(now=clock.now)
    assert [(row["ref"], row["rule"], row["remaining"], row["burst"]) for row in near] == [
        ("key:7", "pro-user", 2, 200)]


def test_d6_decisions_counted_while_redis_is_down_are_flushed_when_it_returns(redis_server):
    """D6: a failed flush used to drop its counts. They stay buffered (merged with what is
    counted meanwhile) and the first flush after the outage writes them and the period."""
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    flusher = Flusher(recorder, suite_redis, clock=clock)
    recorder.record(decision())
    recorder.record(decision(False))
    redis_server.kill()
    try:
        assert flusher.flush_now() == 0  # never raises
        assert "ConnectionError" in flusher.last_error and flusher.failing_since == T0
        clock.now += 30
        recorder.record(decision(identity=key_identity()))  # the same minute, counted since
        clock.now += 60
        recorder.record(decision(False))  # the next minute
        assert flusher.flush_now() == 0
        assert recorder.pending_decisions() == (4, T0)
    finally:
        redis_server.start()
    clock.now += 5
    assert flusher.flush_now() > 0
    assert recorder.dropped == 0 and flusher.failing_since is None and flusher.last_error == ""
    series = {row["minute"]: row for row in limiter().reader.series(2, now=clock.now)}
    assert (series[T0]["allowed"], series[T0]["denied"]) == (2, 1)
    assert (series[T0 + 60]["allowed"], series[T0 + 60]["denied"]) == (0, 1)
    assert limiter().reader.totals()["rule", "free-ip", "denied"] == 2  # Prometheus' counters
    hot = limiter().reader.hot_keys("5m", now=clock.now)
    assert {row["ref"]: row["tokens"] for row in hot["tokens"]} == {"ip:10.0.0.1": 1,
                                                                   "key:7": 1}
    assert limiter().reader.buffered_periods() == [
        {"from": T0, "to": T0 + 95, "decisions": 4, "dropped": 0, "pid": os.getpid()}]
    assert flusher.flush_now() == 0 and recorder.pending_decisions() == (0, None)


def test_d6_the_buffer_is_bounded_while_redis_stays_down(redis_server, redis_client):
    """An hour of counts is kept; older minutes are dropped (and counted as dropped); minutes
    older than the newest 3 keep only what a flush writes of them."""
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    flusher = Flusher(recorder, suite_redis, clock=clock)
    minutes = metrics.MAX_BUFFERED_MINUTES + 10
    with config(HOT_KEYS_CAPACITY=50, METRICS_HOT_KEYS_STORED=5):
        redis_server.kill()
        try:
            for minute in range(minutes):
                for i in range(40):  # 40 identities, each near its limit
                    recorder.record(decision(identity=ip_identity(f"10.0.{minute}.{i}"),
                                             policies=[status("free-ip", remaining=0)]))
                clock.now += 60
                if minute % 20 == 0:
                    assert flusher.flush_now() == 0
            assert recorder.pending_decisions()[0] == 40 * metrics.MAX_BUFFERED_MINUTES
            assert recorder.dropped == 40 * 10
            detailed, compacted = metrics.MAX_DETAILED_MINUTES, metrics.MAX_BUFFERED_MINUTES - 3
            assert recorder.sketch_sizes() <= detailed * 2 * 40 + compacted * 2 * 5
        finally:
            redis_server.start()
        assert flusher.flush_now() > 0
    first_kept = int(T0 // 60) + 10
    assert redis_client.hget(f"rl:m:c:{first_kept}", "all||allowed") == b"40"
    assert not redis_client.exists(f"rl:m:c:{first_kept - 1}")
    assert redis_client.zcard(f"rl:m:hot:tokens:{first_kept}") == 5
    [period] = limiter().reader.buffered_periods()
    assert (period["decisions"], period["dropped"]) == (40 * 60, 40 * 10)


def test_failing_flushes_never_count_against_the_breaker_that_guards_decisions(redis_server):
    """Issue 10 §2: a failed flush is the flusher's own health (failing_since, last_error); the
    decisions' breaker sees none of it, so metrics trouble never makes requests fail open or
    closed. Nor does the flush wait for that breaker: it writes as soon as Redis answers."""
    with config(BREAKER_FAILURES=3, BREAKER_COOLDOWN_S=3600):
        worker = default_limiter()
        worker.recorder.record(decision())
        redis_server.kill()
        try:
            for _ in range(5):
                assert worker.flusher.flush_now() == 0
            assert worker.flusher.failing_since is not None and worker.flusher.last_error
            assert worker.breaker.state == worker.breaker.CLOSED
            assert worker.stats.redis_errors == 0
            # the breaker's failure count is still 0: two decision-path failures leave it
            # closed, the third opens it
            for _ in range(2):
                with pytest.raises(StoreUnavailable):
                    worker.read_version()
            assert worker.breaker.state == worker.breaker.CLOSED
            with pytest.raises(StoreUnavailable):
                worker.read_version()
            assert worker.breaker.state == worker.breaker.OPEN
        finally:
            redis_server.start()
        assert worker.flusher.flush_now() > 0  # the decisions' breaker is still open
        assert worker.breaker.state == worker.breaker.OPEN and worker.breaker.times_opened == 1
    assert worker.flusher.failing_since is None
    assert limiter().reader.totals()["all", "", "allowed"] == 1


def test_an_unexpected_flush_error_is_counted_logged_and_its_counts_sent_next_time(caplog):
    """Not Redis being down but a bug or bad data (here a retention setting that is no number,
    a real ValueError inside the flush, on the suite's real Redis): counted apart from Redis
    errors, logged with its traceback, and the counts it could not send reach Redis with the
    next flush that works, like those kept through a Redis outage."""
    from ratelimit_app.views.prometheus import collect

    worker = limiter()
    good = worker.config
    worker.recorder.record(decision())
    worker.recorder.record(decision(False))
    worker.config = {**good, "METRICS_RETENTION_S": "one day"}
    assert worker.flusher.flush_now() == 0  # never raises
    assert worker.flusher.flush_now() == 0  # tried again at the next tick: still kept

    assert worker.recorder.pending_decisions()[0] == 2
    assert worker.flusher.last_error.startswith("ValueError: invalid literal for int()")
    stats = worker.stats
    assert stats.unexpected_by_type == {"ValueError": 2} and stats.redis_errors == 0
    [family] = [f for f in collect() if f.name == "ratelimit_process_unexpected_errors"]
    assert [(s.labels, s.value) for s in family.samples if s.name.endswith("_total")] == \
        [({"type": "ValueError"}, 2)]
    [logged] = [r for r in caplog.records if "unexpected ValueError" in r.getMessage()]
    assert logged.levelno == logging.ERROR and logged.exc_info[0] is ValueError  # once a minute
    assert logged.getMessage().startswith("ratelimit_app: unexpected ValueError while flushing "
                                          "metrics; the counts are kept for the next flush: ")
    assert not suite_redis().exists(metrics.fields.totals_key(good["KEY_PREFIX"]))

    worker.config = good  # the bug fixed: the next flush sends what was kept
    assert worker.flusher.flush_now() > 0
    assert worker.recorder.pending_decisions() == (0, None) and worker.flusher.last_error == ""
    totals = worker.reader.totals()
    assert (totals["all", "", "allowed"], totals["rule", "free-ip", "denied"]) == (1, 1)


def test_background_thread_flushes_by_itself_and_stops(redis_client):
    recorder = Recorder()
    flusher = Flusher(recorder, suite_redis)
    recorder.record(decision())
    with config(METRICS_FLUSH_INTERVAL_S=0.02):
        flusher.ensure_running()
        try:
            deadline = time.monotonic() + 5
            while flusher.flushes == 0 and time.monotonic() < deadline:
                threading.Event().wait(0.01)  # polling a real thread, with a deadline
        finally:
            flusher.stop()
    assert flusher.flushes == 1 and not flusher.running
    assert redis_client.keys("rl:m:c:*")


# --- the request path ---------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_request_costs_one_redis_command_and_the_flush_none_of_its_own(client, redis_server):
    """Requests through the real middleware and throttle send only their EVALSHA; the counts
    reach Redis later, in the flusher's pipeline."""
    call_command("load_demo", stdout=io.StringIO())
    headers = {"HTTP_X_API_KEY": "rk_bob_pro"}
    client.get("/api/items/", **headers)  # warm-up: the snapshot loads (reads the version)
    client.get("/hello/")
    with commands_sent(redis_server.client()) as sent:
        for _ in range(10):
            assert client.get("/api/items/", **headers).status_code == 200
            assert client.get("/hello/").status_code == 200
    assert [command.split()[0] for command in sent] == ["evalsha"] * 20
    assert limiter().recorder.counts()["all", "", "allowed"] == 22
    with commands_sent(redis_server.client()) as sent:
        limiter().flusher.flush_now()
    names = {command.split()[0] for command in sent}
    assert "hincrby" in names and "evalsha" not in names
    breakdown = limiter().reader.breakdown("5m")
    assert breakdown["plan"]["pro"]["allowed"] == 11
    assert breakdown["endpoint"]["hello"]["allowed"] == 11
