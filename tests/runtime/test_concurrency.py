"""Many processes and threads hammering ONE bucket never get more than the bucket allows.

8 processes x 8 threads call ``Limiter.take`` (server time, no ``now_ms``) on one bucket of burst 10
and 10 tokens per second for 3 seconds. The most any correct limiter can allow is
burst + rate x duration = 10 + 10 x 3 = 40; a limiter that reads and writes in separate steps lets
many more through.

The 3 seconds are measured by the Redis clock, exactly, so a noisy machine cannot stretch them:

- Start: the bucket is seeded full with its refill timestamp at ``start`` (Redis time, a moment
  after every thread is hammering). The script never moves a timestamp backwards, so the burst can
  be spent at once but nothing refills before ``start``.
- Every call also carries a *stopwatch*: a shadow bucket seeded empty at ``start`` whose cost is
  above its capacity. It can never be afforded, so it is never written and never denies, and its
  reported level is exactly the milliseconds since ``start`` of that very call (capped at the
  stopwatch's capacity). Threads stop at the first reading past 3000 ms and only readings up to
  3000 ms count: the window ends exactly 3 s after the refill began, wherever a thread was
  descheduled.

The local deny cache lives in ``Limiter.decide``, above ``Limiter.take``, so it plays no part here.
Every allowed call also reports the bucket's exact level; replaying them in order checks that
Redis's own books agree with the count (no token spent twice, none lost).
"""

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from ratelimit_app.decision.buckets import pack_value

from ..helpers import make_bucket, make_rule

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROCESSES, THREADS = 8, 8
BURST, RATE_PER_S, WINDOW_MS = 10, 10, 3000
MAX_ALLOWED = BURST + RATE_PER_S * WINDOW_MS // 1000  # 40
MIN_ALLOWED = MAX_ALLOWED - 2  # the last refills may land after the last call of the window
UNITS_PER_TOKEN = 1000  # period_ms of a 1-second rule (see decision/buckets.py)
STOPWATCH_CAPACITY_S = 60
LEAD_MS = 500  # the refill starts this long after the gate opens: every thread is busy
FAR_FUTURE_MS = 10**13

# One worker process: THREADS threads call take() until the stopwatch passes the window, then
# print what they saw as one JSON line. Waits for "go" on stdin so all start together.
WORKER = """
import json, sys, threading, time
import django
django.setup()
from django.conf import settings
# a loaded 2-core machine may answer slower than the demo's 0.25 s socket timeout; this test
# is about atomicity, not latency
settings.CACHES["default"]["OPTIONS"].update(SOCKET_TIMEOUT=10, SOCKET_CONNECT_TIMEOUT=10)
from ratelimit_app.decision.buckets import Bucket
from ratelimit_app.decision.engine import statuses_from
from ratelimit_app.runtime.limiter import default_limiter
from ratelimit_app.config.snapshot import CompiledRule

config = json.loads(sys.argv[1])
buckets = [Bucket(CompiledRule(**b["rule"]), b["key"], b["cost"]) for b in config["buckets"]]
go = threading.Event()
lock = threading.Lock()
seen = {"allowed": [], "decisions": 0, "errors": []}

def hammer():
    go.wait()
    give_up_at = time.monotonic() + 60  # only if the stopwatch never starts
    decisions, allowed = 0, []
    try:
        while time.monotonic() < give_up_at:
            reply = default_limiter().take(buckets)
            ok, statuses = reply.allowed, statuses_from(buckets, reply)
            decisions += 1
            elapsed_ms = statuses[1].level_units
            if ok:
                allowed.append([elapsed_ms, statuses[0].level_units])
            if elapsed_ms > config["window_ms"]:
                break
        else:
            raise RuntimeError("the stopwatch never passed the window")
    except Exception as exc:
        with lock:
            seen["errors"].append(repr(exc))
    with lock:
        seen["allowed"].extend(allowed)
        seen["decisions"] += decisions

threads = [threading.Thread(target=hammer) for _ in range(config["threads"])]
for thread in threads:
    thread.start()
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
go.set()
for thread in threads:
    thread.join()
print(json.dumps(seen), flush=True)
"""

# Opens the gate: the bucket full and the stopwatch at zero, both from `start` (Redis time).
OPEN_GATE = """
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
-- take.lua's layout: the key's expiry (0: set on the next debit), then rule id, level, stamp, period
redis.call('SET', KEYS[1], struct.pack('<i8i4i8i8i8', 0, tonumber(ARGV[4]), tonumber(ARGV[2]), start, tonumber(ARGV[3])))
redis.call('SET', KEYS[2], struct.pack('<i8i4i8i8i8', 0, tonumber(ARGV[5]), 0, start, tonumber(ARGV[3])))
return start
"""


def closed(bucket, redis_client):
    """Seed ``bucket`` empty with no refill until the far future (nothing can pass yet)."""
    redis_client.set(bucket.key, pack_value({bucket.rule.id: (0, FAR_FUTURE_MS, UNITS_PER_TOKEN)}))


def start_workers(config):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"}
    workers = []
    for _ in range(PROCESSES):
        workers.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(config)], cwd=PROJECT_ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    return workers


def stop(workers):
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
        worker.wait(30)
        worker.stdin.close()
        worker.stdout.close()


def replay(allowed):
    """Check every allowed call against the bucket's own arithmetic, in Redis order.

    Denied calls write nothing, so the bucket's history is the allowed calls alone: before each
    one it refilled RATE_PER_S units per ms since the previous one (never beyond capacity), and
    the call took one token. The level each call reported must be exactly that.
    """
    capacity = BURST * UNITS_PER_TOKEN
    level, last_ms = capacity, 0
    for n, (elapsed_ms, reported) in enumerate(sorted(allowed, key=lambda c: (c[0], -c[1])), 1):
        level = min(capacity, level + RATE_PER_S * (elapsed_ms - last_ms)) - UNITS_PER_TOKEN
        last_ms = elapsed_ms
        assert reported == level, f"allowed call {n} at {elapsed_ms} ms left {reported}, not {level}"


def test_one_bucket_hammered_by_8_processes_x_8_threads_allows_at_most_burst_plus_rate(
        redis_server, redis_client):
    bucket = make_bucket(make_rule(rate=RATE_PER_S, period_s=1, burst=BURST), token="hammer")
    stopwatch = make_bucket(make_rule(rate=1, period_s=1, burst=STOPWATCH_CAPACITY_S,
                                      shadow=True), cost=STOPWATCH_CAPACITY_S + 1,
                            token="stopwatch")
    closed(bucket, redis_client)
    closed(stopwatch, redis_client)
    config = {"threads": THREADS, "window_ms": WINDOW_MS,
              "buckets": [{"rule": asdict(b.rule), "key": b.key, "cost": b.cost}
                          for b in (bucket, stopwatch)]}

    workers = start_workers(config)
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        redis_client.eval(OPEN_GATE, 2, bucket.key, stopwatch.key, LEAD_MS,
                          BURST * UNITS_PER_TOKEN, UNITS_PER_TOKEN, bucket.rule.id,
                          stopwatch.rule.id)
        reports = [json.loads(worker.stdout.readline()) for worker in workers]
        for worker in workers:
            assert worker.wait(30) == 0
    finally:
        stop(workers)

    errors = [e for r in reports for e in r["errors"]]
    assert errors == []
    allowed = [call for r in reports for call in r["allowed"]]
    in_window = [call for call in allowed if call[0] <= WINDOW_MS]
    decisions = sum(r["decisions"] for r in reports)
    print(f"\n{decisions} decisions by {PROCESSES}x{THREADS} threads; allowed in the 3 s "
          f"window: {len(in_window)} (bound {MAX_ALLOWED}); allowed after it: "
          f"{len(allowed) - len(in_window)}")

    assert MIN_ALLOWED <= len(in_window) <= MAX_ALLOWED, \
        f"allowed at these ms of the window: {sorted(call[0] for call in allowed)}"
    assert decisions > 20 * MAX_ALLOWED  # it really was hammered
    replay(allowed)
