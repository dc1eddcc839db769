"""Concurrency limits (Rule kind "concurrency"): at most N requests of a scope value in flight,
the slot taken in take.lua's one atomic call beside the token buckets and released when the
response is finished (buckets.ConcurrencySlot, lua/release.lua).

The server tests run a real gunicorn (6 sync worker processes: each serves one request at a time) on the suite's Redis,
with slow views (tests/runtime/concurrency_site.py) that count their own requests in flight in
Redis.
"""

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from ratelimit_app.decision.buckets import ConcurrencySlot, slot_member
from ratelimit_app.decision.headers import policy_header
from ratelimit_app.decision.keys import bucket_key
from ratelimit_app.models import Kind, Rule
from ratelimit_app.stores.base import script_source
from ratelimit_app.testing import _free_port

from ..asgi_server import Uvicorn
from ..asgi_server import get as asgi_get
from ..helpers import limiter, make_bucket, make_rule

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = str(Path(sys.executable).parent / "gunicorn")  # this virtualenv's
LIMIT = 3
HANG_TIMEOUT_S = 2

RULES = f"""
import django
django.setup()
from ratelimit_app.models import Rule
# refuse when Redis does not answer in time: on a loaded machine a fail-open timeout (or an
# open breaker) would let a request in without a slot, and the count below would exceed LIMIT
Rule.objects.create(name="slow-inflight", scope="ip", endpoint="slow", kind="concurrency",
                    rate={LIMIT}, period_s=30, burst={LIMIT}, on_redis_failure="closed")
for endpoint in ("boom", "stream"):
    Rule.objects.create(name=endpoint + "-inflight", scope="ip", endpoint=endpoint,
                        kind="concurrency", rate=1, period_s=30, burst=1)
Rule.objects.create(name="hang-inflight", scope="ip", endpoint="hang", kind="concurrency",
                    rate=1, period_s={HANG_TIMEOUT_S}, burst=1)
Rule.objects.create(name="both-inflight", scope="ip", endpoint="both", kind="concurrency",
                    rate=1, period_s=30, burst=1)
Rule.objects.create(name="aslow-inflight", scope="ip", endpoint="aslow", kind="concurrency",
                    rate=1, period_s=30, burst=1)
Rule.objects.create(name="both-bucket", scope="ip", endpoint="both", rate=1, period_s=3600,
                    burst=2)
"""


class Answer:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body


def get(port, path, client_ip):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"X-Forwarded-For": client_ip})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.headers, error.read())


def site_env(workdir, redis_server, database_env):
    """The environment of a server of tests/runtime/concurrency_site.py with RULES in its own
    database."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.runtime.concurrency_site",
           **database_env(workdir), "REDIS_URL": redis_server.url,
           "DEMO_BEHIND_PROXY": "1", "DJANGO_DEBUG": "0"}
    for args in (["manage.py", "migrate", "--verbosity", "0"], ["-c", RULES]):
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis_server, database_env):
    workdir = tmp_path_factory.mktemp("concurrency")
    env = site_env(workdir, redis_server, database_env)
    port = _free_port()
    log = open(workdir / "gunicorn.log", "wb")
    process = subprocess.Popen(
        [GUNICORN, "project.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "6",
         "--worker-class", "sync", "--timeout", "60",
         "--control-socket", str(workdir / "gunicorn.ctl"), "--log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 30
    while True:
        try:
            if get(port, "/health/", "10.0.0.1").status == 200:
                break
        except OSError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, \
            (workdir / "gunicorn.log").read_text()
        time.sleep(0.05)  # deadline poll
    yield port
    process.terminate()
    process.wait(10)
    log.close()


def slots_held(redis_client):
    """The slots held in every concurrency limit's sorted set."""
    return sum(redis_client.zcard(key) for key in redis_client.keys("*:inflight:*"))


def test_never_more_than_n_in_flight_across_worker_processes(server, redis_client):
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: get(server, "/slow/?s=0.3", "10.1.0.1"), range(24)))
    ok = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 429]
    assert len(ok) + len(refused) == 24 and len(ok) >= LIMIT and refused
    seen = [int(n) for n in redis_client.lrange("seen:slow", 0, -1)]
    assert max(seen) <= LIMIT  # measured in the view itself
    assert len({a.body for a in ok}) > 1  # served by several worker processes
    problem = refused[0]
    assert problem.headers["Content-Type"] == "application/problem+json"
    assert b"slow-inflight" in problem.body and int(problem.headers["Retry-After"]) >= 1
    assert problem.headers["RateLimit-Policy"] == \
        f'"slow-inflight";q={LIMIT};qu="concurrent-requests"'
    wait_released(redis_client)  # every slot released


def test_slots_are_released_after_an_exception_and_a_streaming_response(server, redis_client):
    for _ in range(3):  # one slot: a leaked one would never be released
        assert get(server, "/boom/", "10.2.0.1").status == 500
        # released when the worker closes the response, which may be just after the client
        # read it; the next request may reach another worker before that
        wait_released(redis_client)
        answer = get(server, "/stream/", "10.2.0.1")
        assert answer.status == 200 and answer.body.count(b"chunk") == 3
        wait_released(redis_client)


def test_a_killed_workers_slot_frees_at_its_timeout(server, redis_client):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        hung = pool.submit(get, server, "/hang/", "10.3.0.1")
        deadline = time.monotonic() + 10
        while redis_client.get("hang:pid") is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)  # deadline poll
        taken_at = time.monotonic()
        assert get(server, "/hang/?again", "10.3.0.1").status == 429  # the slot is held
        os.kill(int(redis_client.get("hang:pid")), signal.SIGKILL)
        with pytest.raises(Exception):
            hung.result()  # the connection died with its worker
    redis_client.delete("hang:pid")
    assert slots_held(redis_client) == 1  # leaked by the dead worker, for now
    # a request is refused until the dead worker's slot reaches its deadline, then served
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        while True:
            future = pool.submit(get, server, "/hang/", "10.3.0.1")
            while not future.done() and redis_client.get("hang:pid") is None:
                time.sleep(0.02)  # deadline poll
            if redis_client.get("hang:pid") is not None:
                break  # served: it took the slot
            assert future.result().status == 429
            assert time.monotonic() - taken_at < HANG_TIMEOUT_S + 2
            time.sleep(0.05)  # deadline poll
        assert time.monotonic() - taken_at >= HANG_TIMEOUT_S - 0.2  # not before its deadline
        os.kill(int(redis_client.get("hang:pid")), signal.SIGKILL)
        with pytest.raises(Exception):
            future.result()
    redis_client.delete("hang:pid")


def remaining(answer, name):
    for item in answer.headers["RateLimit"].split(", "):
        if item.startswith(f'"{name}"'):
            return int(item.split(";r=")[1].split(";")[0])
    return None


def test_all_or_nothing_with_a_token_bucket_both_ways(server, redis_client):
    # a slot held: a second request is refused by the concurrency limit and debits no token
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(get, server, "/both/?s=1", "10.4.0.1")
        deadline = time.monotonic() + 10
        while slots_held(redis_client) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)  # deadline poll
        refused = get(server, "/both/", "10.4.0.1")
        assert refused.status == 429 and b"both-inflight" in refused.body
        assert b"both-bucket" not in refused.body
        first = first.result()
    assert first.status == 200 and remaining(first, "both-bucket") == 1
    wait_released(redis_client)
    # the bucket's last token, then the bucket refuses: that request holds no slot
    assert remaining(get(server, "/both/", "10.4.0.1"), "both-bucket") == 0
    wait_released(redis_client)  # else the next request may also meet that request's slot
    refused = get(server, "/both/", "10.4.0.1")
    assert refused.status == 429 and b"both-bucket" in refused.body
    assert b"both-inflight" not in refused.body
    wait_released(redis_client)


# --- under uvicorn: the decision on QuotaMiddleware's async path, the release on close --------

@pytest.fixture(scope="module")
def asgi_server(tmp_path_factory, redis_server, database_env):
    workdir = tmp_path_factory.mktemp("concurrency-asgi")
    uvicorn = Uvicorn(site_env(workdir, redis_server, database_env), workdir).start()
    yield uvicorn
    uvicorn.stop()
    assert "Traceback" not in uvicorn.log(), uvicorn.log()


def wait_released(redis_client, timeout_s=5):
    """A slot is released when the response closes, after its last byte is sent (gunicorn and
    uvicorn alike): the client may read the answer a moment before. Poll until none is held."""
    deadline = time.monotonic() + timeout_s
    while slots_held(redis_client):
        assert time.monotonic() < deadline, "a slot was never released"
        time.sleep(0.01)  # deadline poll


def test_under_uvicorn_one_slot_is_held_and_released_when_the_response_closes(asgi_server,
                                                                             redis_client):
    for _ in range(2):  # a leaked slot would refuse the second round's first request
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(asgi_get, asgi_server, "/aslow/?s=1", "10.5.0.1")
            deadline = time.monotonic() + 10
            while slots_held(redis_client) == 0:
                assert time.monotonic() < deadline and not first.done()
                time.sleep(0.02)  # deadline poll
            second = asgi_get(asgi_server, "/aslow/", "10.5.0.1")
            first = first.result()
        assert first.status == 200 and first.body == b"ok"
        assert second.status == 429 and b"aslow-inflight" in second.body
        assert second.headers["RateLimit-Policy"] == \
            '"aslow-inflight";q=1;qu="concurrent-requests"'
        wait_released(redis_client)  # released when the first response closed
    # sent together: one served, one refused, nothing held afterwards
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: asgi_get(asgi_server, "/aslow/?s=0.5", "10.5.0.2"),
                                range(2)))
    assert sorted(a.status for a in answers) == [200, 429]
    wait_released(redis_client)


# --- in process ------------------------------------------------------------------------------

def concurrency_rule(rate=2, timeout_s=30, **kwargs):
    import dataclasses
    return dataclasses.replace(make_rule(rate=rate, period_s=timeout_s, burst=rate, **kwargs),
                               concurrency=True)


def slot_bucket(rule, token="user.test"):
    return ConcurrencySlot(rule, bucket_key("rl", token), 1)


def test_release_is_idempotent_and_frees_the_slot(redis_client):
    rule = concurrency_rule(rate=1)
    bucket = slot_bucket(rule)
    reply = limiter().take([bucket], slot_id=7)
    assert reply.allowed and redis_client.zcard(bucket.key) == 1
    assert not limiter().take([bucket], slot_id=8).allowed
    assert limiter().store.release([bucket.key], slot_member(7)) == 1
    assert limiter().store.release([bucket.key], slot_member(7)) == 0  # again: nothing
    assert limiter().store.release([bucket.key], slot_member(8)) == 0  # never taken
    assert limiter().take([bucket], slot_id=9).allowed


def test_a_refused_decision_takes_no_slot_and_a_peek_none(redis_client):
    rule, empty = concurrency_rule(rate=5), make_rule(rate=1, period_s=3600, burst=1)
    slot, bucket = slot_bucket(rule), make_bucket(empty)
    assert limiter().take([bucket], slot_id=1).allowed  # the bucket's only token
    reply = limiter().take([slot, bucket], slot_id=2)
    assert not reply.allowed and redis_client.zcard(slot.key) == 0
    assert reply.levels[0] == 5  # all five slots free, as before the call
    assert limiter().take([slot], slot_id=3, debit=False).allowed
    assert redis_client.zcard(slot.key) == 0


def test_refund_releases_the_slot_of_a_group_refused_elsewhere(redis_client):
    # what the cluster store runs in a group that debited while another group refused
    rule = concurrency_rule(rate=1)
    slot = slot_bucket(rule)
    args = [b"", b"1", slot.spec_at(0, 42)]
    assert limiter().take([slot], slot_id=42).allowed
    refund = redis_client.register_script(script_source("refund"))
    for _ in range(2):  # retried: still released once, nothing else changes
        assert refund(keys=[slot.key, "rl:{user.test}:refund:x"], args=[60000, *args[2:]]) \
            == [1]
    assert redis_client.zcard(slot.key) == 0


def test_the_policy_header_names_the_unit():
    status = slot_bucket(concurrency_rule(rate=4, name="exports")).status(3, False)
    assert policy_header([status]) == '"exports";q=4;qu="concurrent-requests"'
    assert (status.remaining, status.reset_s) == (3, 1)


def test_a_concurrency_limits_t_is_never_0():
    # draft-11's t: the seconds until more quota is made available; a slot may free any
    # moment, and 0 would say more slots are free right now (even with all of them free)
    slot = slot_bucket(concurrency_rule(rate=4))
    assert [slot.status(level, short).reset_s for level, short in
            ((4, False), (3, False), (0, False), (0, True))] == [1, 1, 1, 1]


@pytest.mark.django_db
def test_the_rule_validates_its_timeout_and_limit():
    rule = Rule(name="exports", scope="tenant", kind=Kind.CONCURRENCY, rate=5, period_s=None)
    with pytest.raises(ValidationError) as error:
        rule.full_clean()
    assert "timeout" in str(error.value.message_dict["period_s"])
    rule = Rule(name="exports", scope="tenant", kind=Kind.CONCURRENCY, rate=5, period_s=60,
                lease=2)
    with pytest.raises(ValidationError) as error:
        rule.full_clean()
    assert "lease" in error.value.message_dict
    rule = Rule(name="exports", scope="tenant", kind=Kind.CONCURRENCY, rate=5, period_s=60)
    rule.full_clean()
    assert rule.burst == 5 and rule.describe().startswith("at most 5 requests in flight")


# --- on a real Redis Cluster: the slot in one slot group, a token bucket in another ------------

CLUSTER_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 1}
CLUSTER_LIMIT = 2


@pytest.fixture
def cluster_workers(redis_cluster, settings, db):
    """Three Limiters (three workers) on the session's cluster, each with its own client, and
    two endpoints limited per IP by a concurrency rule beside a global token bucket (the global
    bucket is in its own slot group: ``rl:{global}``)."""
    from ratelimit_app.conf import get_config
    from ratelimit_app.runtime.limiter import Limiter
    from ratelimit_app.stores.cluster import ClusterStore

    redis_cluster.ensure_healthy()
    redis_cluster.flushall()
    nodes = [redis_cluster.nodes[0].address]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CLUSTER_NODES": nodes,
                              "CLUSTER_OPTIONS": CLUSTER_OPTIONS}
    for endpoint, burst in (("exports", 1), ("reports", 10_000)):
        Rule.objects.create(name=f"{endpoint}-inflight", scope="ip", endpoint=endpoint,
                            kind="concurrency", rate=CLUSTER_LIMIT, period_s=30,
                            burst=CLUSTER_LIMIT)
        Rule.objects.create(name=f"{endpoint}-global", scope="global", endpoint=endpoint,
                            rate=1, period_s=3600, burst=burst)
    workers = [Limiter(get_config(), ClusterStore.from_nodes(nodes, CLUSTER_OPTIONS),
                       metrics_autostart=False) for _ in range(3)]
    for worker in workers:
        worker.snapshot()  # loaded here: the test database is not shared with threads
    yield workers
    for worker in workers:
        worker.close()
        close_cluster_client(worker.store.client)


def close_cluster_client(client):
    """Close a RedisCluster and its nodes' connections (its close() leaves those open)."""
    for node in client.get_nodes():
        node.redis_connection.connection_pool.disconnect()
    client.close()


@contextlib.contextmanager
def cluster_client(redis_cluster):
    client = redis_cluster.client()
    try:
        yield client
    finally:
        close_cluster_client(client)


def ip_request(ip):
    from django.test import RequestFactory
    return RequestFactory().get("/x/", REMOTE_ADDR=ip)


def inflight_key(worker, endpoint, ip):
    rule = next(r for r in worker.snapshot().rules if r.name == f"{endpoint}-inflight")
    from ratelimit_app.decision.keys import scope_token
    return f"{bucket_key('rl', scope_token('ip', ip))}:inflight:{rule.id}"


@pytest.mark.slow
def test_on_a_cluster_a_refusal_in_another_group_releases_the_slot(redis_cluster,
                                                                   cluster_workers):
    worker = cluster_workers[0]
    ip = "192.0.2.1"
    with cluster_client(redis_cluster) as client:
        # the first decision: both groups allow; the slot is held until released
        first = worker.decide(ip_request(ip), None, "exports")
        assert first.allowed and first.slot is not None
        (key,), _member = first.slot
        assert redis_cluster.slot_of(key) != redis_cluster.slot_of("rl:{global}")
        assert key == inflight_key(worker, "exports", ip)
        assert client.zcard(key) == 1
        assert worker.release_slot(first) and client.zcard(key) == 0
        # the global bucket (its only token spent) refuses; the slot taken in the IP's group
        # in the same decision is given back by the refund
        refused = worker.decide(ip_request(ip), None, "exports")
        assert not refused.allowed and refused.violated == ("exports-global",)
        assert refused.slot is None
        assert client.zcard(key) == 0
        # again, while another request holds a slot: only the refused one's slot is returned
        held = cluster_workers[1].decide(ip_request("192.0.2.2"), None, "reports")
        other = inflight_key(worker, "reports", "192.0.2.2")
        assert held.allowed and client.zcard(other) == 1
        for n in range(3):
            assert not cluster_workers[n].decide(ip_request(ip), None, "exports").allowed
        assert client.zcard(key) == 0 and client.zcard(other) == 1
        assert cluster_workers[1].release_slot(held) and client.zcard(other) == 0


@pytest.mark.slow
def test_on_a_cluster_n_in_flight_across_three_workers(redis_cluster, cluster_workers):
    import threading

    ip = "192.0.2.3"
    key = inflight_key(cluster_workers[0], "reports", ip)
    with cluster_client(redis_cluster) as client:
        # one worker after the other: N held, the next refused naming the limit
        held = [cluster_workers[n].decide(ip_request(ip), None, "reports")
                for n in range(CLUSTER_LIMIT)]
        assert all(d.allowed for d in held) and client.zcard(key) == CLUSTER_LIMIT
        refused = cluster_workers[2].decide(ip_request(ip), None, "reports")
        assert not refused.allowed and refused.violated == ("reports-inflight",)
        assert client.zcard(key) == CLUSTER_LIMIT
        assert cluster_workers[0].release_slot(held[0])
        again = cluster_workers[2].decide(ip_request(ip), None, "reports")
        assert again.allowed  # a freed slot is free for any worker
        for worker, decision in ((cluster_workers[1], held[1]), (cluster_workers[2], again)):
            worker.release_slot(decision)
        assert client.zcard(key) == 0

        # three workers at once: never more than N in flight, measured around each request
        lock, counts = threading.Lock(), {"now": 0, "max": 0, "ok": 0, "refused": 0}

        def work(worker):
            for _ in range(30):
                decision = worker.decide(ip_request(ip), None, "reports")
                if not decision.allowed:
                    assert decision.violated == ("reports-inflight",)
                    with lock:
                        counts["refused"] += 1
                    continue
                with lock:
                    counts["now"] += 1
                    counts["ok"] += 1
                    counts["max"] = max(counts["max"], counts["now"])
                time.sleep(0.005)  # the workload
                with lock:
                    counts["now"] -= 1  # before the release: the slot is still held
                assert worker.release_slot(decision)

        threads = [threading.Thread(target=work, args=(w,)) for w in cluster_workers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(f"\n3 workers x 30 decisions, limit {CLUSTER_LIMIT}: {counts}")
    assert counts["ok"] + counts["refused"] == 90
    assert counts["max"] <= CLUSTER_LIMIT and counts["ok"] >= CLUSTER_LIMIT
    with cluster_client(redis_cluster) as client:
        assert client.zcard(key) == 0
