"""The cluster store on a real 3-master/3-replica Redis Cluster (the session's ``redis_cluster``).

What is shown: one EVALSHA per slot group; all-or-nothing across groups (refunds exact, never
above capacity, idempotent; a group whose answer is lost is never refunded); no over-grant at any
level under 4 worker processes; identities spread over every master; reset, scan, the config
version; a master killed under load (0 answers >= 500, served again soon after the promotion,
NOSCRIPT on the promoted node handled); and the store system checks.
"""

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.test import Client, override_settings
from redis.exceptions import ClusterCrossSlotError

from ratelimit_app.decision.buckets import (
    BanGate,
    CheckedBucket,
    pack_value,
    read_state,
    unpack_value,
)
from ratelimit_app.decision.engine import Decision, take_args
from ratelimit_app.decision.keys import bucket_key, scope_token
from ratelimit_app.metrics import WAIT_BATCH
from ratelimit_app.protection.bans import BanGateRule, gate_record_id
from ratelimit_app.runtime.limiter import Limiter
from ratelimit_app.stores import StoreMisconfigured, StoreUnavailable
from ratelimit_app.stores.base import reply_code
from ratelimit_app.stores.cluster import ClusterStore
from ratelimit_app.stores.redis import RedisStore

from ..helpers import limiter, load_demo_data, make_bucket, make_rule, take, use_fake_clock

PROJECT_ROOT = Path(__file__).resolve().parents[2]
UNITS = 1000  # units per token of a 1-second rule
# Units per token of a 1-minute rule. Tests that read keys back or count them use such rules: a
# key lives its refill time + 1 s, so a key of a 1-second rule (10 tokens/s: 1.1 s) expired once
# between a take and its read in CI, with two matrix cells loading the machine.
MINUTE = 60_000


def slot_owners(cluster):
    """Return ``slot -> port of its master`` for every slot, as the cluster says now."""
    owners = {}
    for entry in cluster.cluster_view():
        if "master" in entry["flags"]:
            for first, last in entry["slots"]:
                owners.update(dict.fromkeys(range(first, last + 1), entry["port"]))
    return owners


def token_per_master(cluster, kind="user"):
    """Return one scope token per master (in the masters' order), each hashing to it."""
    owners, tokens = slot_owners(cluster), {}
    for n in range(10_000):
        token = f"{kind}.{n}"
        port = owners[cluster.slot_of(bucket_key("rl", token))]
        tokens.setdefault(port, token)
        if len(tokens) == len(cluster.masters()):
            break
    return [tokens[master.port] for master in cluster.masters()]


def minute_rule(burst, **fields):
    """A rule of one token a minute (see MINUTE)."""
    return make_rule(rate=1, period_s=60, burst=burst, **fields)


def stored(cluster, key):
    """Return the raw value of ``key`` (None when missing)."""
    return cluster.client().get(key)


def evalsha_per_master(cluster):
    return [master.command_calls("evalsha") for master in cluster.masters()]


# --- one call per slot group ------------------------------------------------------------------

def test_a_decision_over_3_masters_is_one_evalsha_per_slot_group(cluster):
    rules = [minute_rule(5, scope="global"), minute_rule(5, scope="plan"), minute_rule(5)]
    tokens = token_per_master(cluster)
    buckets = [make_bucket(rule, token=token) for rule, token in zip(rules, tokens)]
    # a second bucket in the client's slot joins that group's call
    buckets.append(make_bucket(minute_rule(5, endpoint="api:items"), token=tokens[2]))
    take(buckets, debit=False)  # loads the script on the masters (NOSCRIPT once each)

    before = evalsha_per_master(cluster)
    allowed, statuses, version = take(buckets)
    after = evalsha_per_master(cluster)

    assert [b - a for a, b in zip(before, after)] == [1, 1, 1]
    assert allowed and version is None  # the version is polled, not carried by group calls
    assert [s.level_units for s in statuses] == [4 * MINUTE] * 4
    for bucket in buckets:
        assert read_state(stored(cluster, bucket.key), bucket.rule.id)[0] == 4 * MINUTE


def test_one_identity_in_one_slot_is_a_single_evalsha(cluster):
    token = token_per_master(cluster)[0]
    buckets = [make_bucket(minute_rule(3), token=token) for _ in range(4)]
    take(buckets, debit=False)
    before = cluster.command_calls("evalsha", masters_only=True)
    allowed, statuses, _ = take(buckets)
    assert cluster.command_calls("evalsha", masters_only=True) - before == 1
    assert allowed and [s.level_units for s in statuses] == [2 * MINUTE] * 4


def test_decisions_are_counted_while_a_call_waits_for_the_masters(cluster):
    recorder = limiter().recorder
    buckets = [make_bucket(minute_rule(burst=50), token=t) for t in token_per_master(cluster)]
    take(buckets, debit=False)  # loads the script on the masters
    for _ in range(WAIT_BATCH):
        limiter().record(Decision(allowed=True, endpoint="api:items"))
    assert recorder.queued() == WAIT_BATCH
    assert take(buckets)[0]
    assert recorder.queued() == 0  # counted while the three masters ran the call
    assert recorder.counts()[("endpoint", "api:items", "allowed")] == WAIT_BATCH


# --- all-or-nothing across slot groups ------------------------------------------------------

def test_one_group_short_refunds_every_other_group_exactly(cluster):
    clock = use_fake_clock()
    tokens = token_per_master(cluster)
    global_bucket = make_bucket(minute_rule(10, scope="global"), token=tokens[0])
    shadow_bucket = make_bucket(make_rule(rate=1, period_s=60, burst=10, scope="plan", shadow=True),
                                token=tokens[1])
    plan_bucket = make_bucket(minute_rule(10, scope="plan"), token=tokens[1])
    client_bucket = make_bucket(make_rule(rate=1, period_s=60, burst=3), cost=2, token=tokens[2])
    buckets = [global_bucket, shadow_bucket, plan_bucket, client_bucket]
    assert take(buckets)[0]  # everything debited once: the client bucket now holds 1 < 2

    before = {b.key: unpack_value(stored(cluster, b.key))[1] for b in buckets}
    allowed, statuses, _ = take(buckets)  # same clock: nothing refilled

    assert not allowed
    # every bucket's level and stamp as before (only a key's expiry may have grown)
    assert {b.key: unpack_value(stored(cluster, b.key))[1] for b in buckets} == before
    # the reply shows the refunded levels, and only the client bucket as short
    assert [s.level_units for s in statuses] == [9 * MINUTE, 9 * MINUTE, 9 * MINUTE, MINUTE]
    assert [s.short for s in statuses] == [False, False, False, True]
    # and the next allowed request sees the same levels as if the refused one never came
    clock.advance(60_000)  # one token each
    allowed, statuses, _ = take(buckets)
    assert allowed
    assert [s.level_units for s in statuses] == [9 * MINUTE, 9 * MINUTE, 9 * MINUTE, 0]


def test_a_ban_check_in_a_group_that_debited_is_refunded_with_it(cluster):
    """A ban's check (no ban in force) rides in a group whose bucket was debited while another
    group refused: the refund passes over the check (it debited nothing) and gives the bucket
    back."""
    use_fake_clock()
    tokens = token_per_master(cluster)
    user_bucket = make_bucket(minute_rule(10, scope="user"), token=tokens[0])
    ban_check = BanGate(BanGateRule(id=gate_record_id(7), name="scrapers", scope="user"),
                        user_bucket.key)
    client_bucket = make_bucket(make_rule(rate=1, period_s=60, burst=1), token=tokens[2])
    buckets = [user_bucket, ban_check, client_bucket]
    assert take(buckets)[0]  # the client bucket now empty
    before = unpack_value(stored(cluster, user_bucket.key))[1]

    allowed, statuses, _ = take(buckets)

    assert not allowed
    assert unpack_value(stored(cluster, user_bucket.key))[1] == before
    assert [s.short for s in statuses] == [False, False, True]


@pytest.mark.parametrize("banned", ["user", "address"])
def test_a_ban_in_force_refuses_the_decision_across_slot_groups(cluster, banned):
    """The user's ban rides in the user's bucket of its slot group (stores/ban_checks.py); the
    address's, alone in its group with no bucket to carry it, is sent as built. Either in force
    refuses the whole decision: the other groups' debits are given back."""
    clock = use_fake_clock()
    tokens = token_per_master(cluster)
    user_bucket = make_bucket(minute_rule(10, scope="user"), token=tokens[0])
    user_ban = BanGate(BanGateRule(id=gate_record_id(7), name="guessers", scope="user"),
                       user_bucket.key)
    global_bucket = make_bucket(minute_rule(10, scope="global"), token=tokens[2])
    address_ban = BanGate(BanGateRule(id=gate_record_id(8), name="scrapers", scope="ip"),
                          bucket_key("rl", tokens[1]))
    buckets = [global_bucket, user_bucket, user_ban, address_ban]
    assert take(buckets)[0]  # no ban: both buckets debited once
    ban = user_ban if banned == "user" else address_ban
    stored_before = stored(cluster, ban.key)
    records = unpack_value(stored_before)[1] if stored_before else {}
    records[ban.rule.id] = (-60_000, clock.now_ms, 1000)  # 61 s to run
    cluster.client().set(ban.key, pack_value(records, clock.now_ms + 120_000), px=120_000)
    before = {b.key: unpack_value(stored(cluster, b.key))[1] for b in (global_bucket,
                                                                         user_bucket)}

    allowed, statuses, _ = take(buckets)

    assert not allowed
    assert [s.short for s in statuses] == [False, False, banned == "user",
                                           banned == "address"]
    assert {b.key: unpack_value(stored(cluster, b.key))[1]
            for b in (global_bucket, user_bucket)} == before


def test_a_checked_bucket_is_never_refunded(cluster):
    """A rule counting responses is only checked on the way in (never debited): a refund of
    the decision, refused in another group, gives it nothing back."""
    use_fake_clock()
    tokens = token_per_master(cluster)
    counting = minute_rule(5, scope="user")
    counted = make_bucket(counting, cost=2, token=tokens[0])
    assert take([counted])[0]  # two responses counted: 3 of 5 left
    checked = CheckedBucket(counting, counted.key)
    client_bucket = make_bucket(make_rule(rate=1, period_s=60, burst=1), token=tokens[2])
    assert take([client_bucket])[0]  # the client bucket now empty

    allowed, statuses, _ = take([checked, client_bucket])

    assert not allowed
    assert read_state(stored(cluster, counted.key), counting.id)[0] == 3 * MINUTE
    assert [s.short for s in statuses] == [False, True]


def test_a_refund_never_goes_above_capacity(cluster):
    clock = use_fake_clock()
    store = limiter().store
    bucket = make_bucket(minute_rule(5), cost=2, token=token_per_master(cluster)[0])
    args = take_args([bucket])
    assert take([bucket])[0]  # 3 tokens left
    clock.advance(600_000)  # refilled to full since (the stored level is still 3 at its stamp)

    assert store.refund([bucket.key], args, refund_id="after-refill") == [5 * MINUTE]
    assert read_state(stored(cluster, bucket.key), bucket.rule.id)[0] == 5 * MINUTE
    _, statuses, _ = take([bucket], debit=False)
    assert statuses[0].level_units == 5 * MINUTE

    # a full bucket stays full
    cluster.client().set(bucket.key, pack_value({bucket.rule.id: (5 * MINUTE, clock.now_ms, MINUTE)}))
    assert store.refund([bucket.key], args, refund_id="when-full") == [5 * MINUTE]
    assert read_state(stored(cluster, bucket.key), bucket.rule.id)[0] == 5 * MINUTE


def test_a_retried_refund_adds_nothing(cluster):
    use_fake_clock()
    store = limiter().store
    bucket = make_bucket(minute_rule(10), token=token_per_master(cluster)[1])
    for _ in range(3):
        assert take([bucket])[0]  # 7 left
    args = take_args([bucket])

    assert store.refund([bucket.key], args, refund_id="decision-1") == [8 * MINUTE]
    assert store.refund([bucket.key], args, refund_id="decision-1") == [8 * MINUTE]  # retried
    assert read_state(stored(cluster, bucket.key), bucket.rule.id)[0] == 8 * MINUTE
    assert store.refund([bucket.key], args, refund_id="decision-2") == [9 * MINUTE]


def test_a_group_whose_answer_is_lost_is_never_refunded(cluster, settings):
    """A master that takes the command and does not answer in time: its group's outcome is
    unknown. The groups known to have debited are refunded, the decision fails (fail mode);
    the unknown group is left alone."""
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP,
                              "CLUSTER_OPTIONS": {"socket_timeout": 0.5,
                                                  "socket_connect_timeout": 1}}
    clock = use_fake_clock()
    tokens = token_per_master(cluster)
    # a minute's period: the keys' TTLs (refill time, in real ms) outlast the pause
    buckets = [make_bucket(make_rule(rate=1, period_s=60, burst=10), token=token)
               for token in tokens]
    assert take(buckets)[0]
    before = [unpack_value(stored(cluster, b.key))[1] for b in buckets]
    paused = cluster.masters()[2]
    with paused.client() as client:
        client.execute_command("CLIENT", "PAUSE", 1500, "WRITE")  # scripts wait; no answer
    with pytest.raises(StoreUnavailable) as raised:
        limiter().store.take([b.key for b in buckets], take_args(buckets, clock.now_ms),
                             version_key="v")
    assert not isinstance(raised.value, StoreMisconfigured)
    assert "Timeout" in str(raised.value)
    # refunded exactly (levels and stamps; a key's expiry may have grown)
    assert [unpack_value(stored(cluster, b.key))[1] for b in buckets[:2]] == before[:2]
    # the paused group: debited or not (its command may still run when the pause ends), never
    # refunded; a write returns once the pause is over
    cluster.client(socket_timeout=5).set(buckets[2].key + ":probe", b"1")
    level = read_state(stored(cluster, buckets[2].key), buckets[2].rule.id)[0]
    assert level in (9 * MINUTE, 8 * MINUTE)


def test_noscript_after_a_script_flush_is_handled(cluster):
    use_fake_clock()
    tokens = token_per_master(cluster)
    buckets = [make_bucket(make_rule(rate=1, period_s=60, burst=5), token=token)
               for token in tokens]
    assert take(buckets)[0]
    for master in cluster.masters():
        with master.client() as client:
            client.script_flush()
    allowed, statuses, _ = take(buckets)
    assert allowed and [s.level_units for s in statuses] == [3 * MINUTE] * 3


# --- no over-grant at any level under concurrency -------------------------------------------

PROCESSES, THREADS = 4, 4
WINDOW_MS, LEAD_MS, STOPWATCH_CAPACITY_S = 3000, 800, 60
FAR_FUTURE_MS = 10**13

# One worker process: THREADS threads call take() on [global, stopwatch of global's slot,
# client, stopwatch of the client's slot] until both stopwatches passed the window; prints what
# it saw as one JSON line. A stopwatch (see test_concurrency.py) is a shadow bucket seeded empty
# at the window's start whose cost is above its capacity: never written, never denying, its level
# is the ms since the start at the moment its group ran. One per slot group: each group runs on
# its own master at its own moment.
WORKER = """
import json, sys, threading, time
import django
django.setup()
from django.conf import settings
config = json.loads(sys.argv[1])
settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CLUSTER_NODES": config["nodes"],
                          "CLUSTER_OPTIONS": {"socket_timeout": 10, "socket_connect_timeout": 5}}
from ratelimit_app.decision.buckets import Bucket
from ratelimit_app.decision.engine import statuses_from
from ratelimit_app.runtime.limiter import default_limiter
from ratelimit_app.config.snapshot import CompiledRule

def bucket(b):
    return Bucket(CompiledRule(**b["rule"]), b["key"], b["cost"])

shared = [bucket(b) for b in config["shared"]]
clients = [[bucket(b) for b in pair] for pair in config["clients"]]
go = threading.Event()
lock = threading.Lock()
seen = {"allowed": [], "decisions": 0, "errors": []}

def hammer(client):
    buckets = shared + clients[client]
    # before the gate opens: the process's first call builds its Limiter and reads the
    # Cluster's slots, each thread's opens its connections (on a loaded machine that took more
    # than the gate's lead, and the full buckets lost refill to their cap meanwhile)
    try:
        default_limiter().take(buckets, debit=False)
    finally:
        warmed.wait()
    go.wait()
    give_up_at = time.monotonic() + 60
    decisions, allowed = 0, []
    try:
        while time.monotonic() < give_up_at:
            reply = default_limiter().take(buckets)
            statuses = statuses_from(buckets, reply)
            decisions += 1
            shared_ms, client_ms = statuses[1].level_units, statuses[3].level_units
            if reply.allowed:
                allowed.append([client, shared_ms, client_ms])
            if min(shared_ms, client_ms) > config["window_ms"]:
                break
        else:
            raise RuntimeError("the stopwatches never passed the window")
    except Exception as exc:
        with lock:
            seen["errors"].append(repr(exc))
    with lock:
        seen["allowed"].extend(allowed)
        seen["decisions"] += decisions

threads = [threading.Thread(target=hammer, args=(client,)) for client in config["threads"]]
warmed = threading.Barrier(len(threads) + 1)
for thread in threads:
    thread.start()
warmed.wait(60)
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
go.set()
for thread in threads:
    thread.join()
print(json.dumps(seen), flush=True)
"""


def bucket_json(bucket):
    return {"rule": asdict(bucket.rule), "key": bucket.key, "cost": bucket.cost}


def stopwatch_for(token):
    return make_bucket(make_rule(rate=1, period_s=1, burst=STOPWATCH_CAPACITY_S, shadow=True),
                       cost=STOPWATCH_CAPACITY_S + 1, token=token)


def set_states(client, buckets, state):
    """Write ``state(bucket)`` (level, stamp, period) of every bucket, one value per key."""
    values = {}
    for bucket in buckets:
        values.setdefault(bucket.key, {})[bucket.rule.id] = state(bucket)
    for key, states in values.items():
        client.set(key, pack_value(states))


def hammer_cluster(cluster, shared_bucket, client_buckets):
    """Run PROCESSES x THREADS callers (thread j of process i is client (i + j) % clients);
    return ``(decisions, allowed calls [client, shared_ms, client_ms])``."""
    shared_stopwatch = stopwatch_for(shared_bucket.key.split("{")[1].split("}")[0])
    client_pairs = [[b, stopwatch_for(b.key.split("{")[1].split("}")[0])] for b in client_buckets]
    every = [shared_bucket, shared_stopwatch] + [b for pair in client_pairs for b in pair]
    client = cluster.client()
    # closed until the gate opens (a bucket and its stopwatch share their identity's key)
    set_states(client, every, lambda bucket: (0, FAR_FUTURE_MS, UNITS))
    workers = []
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"}
    for i in range(PROCESSES):
        config = {"nodes": [cluster.nodes[0].address], "window_ms": WINDOW_MS,
                  "shared": [bucket_json(shared_bucket), bucket_json(shared_stopwatch)],
                  "clients": [[bucket_json(b) for b in pair] for pair in client_pairs],
                  "threads": [(i + j) % len(client_buckets) for j in range(THREADS)]}
        workers.append(subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(config)], cwd=PROJECT_ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:
            worker.stdin.write("go\n")
            worker.stdin.flush()
        # open the gate: every bucket full and every stopwatch at 0 from the same `start` (one
        # machine: every node reads the same clock)
        seconds, micros = client.time()
        start = seconds * 1000 + micros // 1000 + LEAD_MS
        set_states(client, every, lambda bucket: (
            0 if bucket.rule.shadow else bucket.capacity_units, start, UNITS))
        reports = [json.loads(worker.stdout.readline()) for worker in workers]
        for worker in workers:
            assert worker.wait(30) == 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait(30)
            worker.stdin.close()
            worker.stdout.close()
    assert [e for r in reports for e in r["errors"]] == []
    return sum(r["decisions"] for r in reports), [c for r in reports for c in r["allowed"]]


def bound(bucket):
    return bucket.rule.burst + bucket.rule.rate * WINDOW_MS // 1000


@pytest.mark.slow
@pytest.mark.parametrize("binding", ["global", "client"])
def test_no_over_grant_at_any_level_with_4_worker_processes(cluster, binding):
    """``binding="global"``: a small global bucket shared by every caller is the limit;
    ``"client"``: four small per-client buckets are. Either way every bucket allows at most
    burst + rate x window, and the binding ones at least that minus 2."""
    small, large = (10, 10), (1000, 1000)  # (burst, rate per s)
    global_numbers, client_numbers = (small, large) if binding == "global" else (large, small)
    tokens = token_per_master(cluster, "key")
    shared_bucket = make_bucket(make_rule(rate=global_numbers[1], burst=global_numbers[0],
                                          scope="global"), token=tokens[0])
    # four clients on the two other masters
    more = [t for t in (f"key.{n}" for n in range(10_000)) if t not in tokens
            and cluster.slot_of(bucket_key("rl", t)) != cluster.slot_of(shared_bucket.key)]
    client_rule = make_rule(rate=client_numbers[1], burst=client_numbers[0])
    client_buckets = [make_bucket(client_rule, token=t) for t in [tokens[1], tokens[2], *more[:2]]]

    decisions, allowed = hammer_cluster(cluster, shared_bucket, client_buckets)

    shared_count = sum(1 for _, shared_ms, _ in allowed if shared_ms <= WINDOW_MS)
    client_counts = [sum(1 for c, _, client_ms in allowed if c == i and client_ms <= WINDOW_MS)
                     for i in range(len(client_buckets))]
    print(f"\n[{binding}-bound] {decisions} decisions by {PROCESSES}x{THREADS} threads; allowed "
          f"in the window: global {shared_count} (max {bound(shared_bucket)}), clients "
          f"{client_counts} (max {bound(client_buckets[0])} each)")
    assert decisions > 10 * bound(shared_bucket if binding == "global" else client_buckets[0])
    assert shared_count <= bound(shared_bucket)
    assert all(count <= bound(client_buckets[0]) for count in client_counts)
    if binding == "global":
        assert shared_count >= bound(shared_bucket) - 2
    else:
        assert all(count >= bound(client_buckets[0]) - 2 for count in client_counts)


# --- keys, reset, scan, version -------------------------------------------------------------

def test_100_identities_spread_over_every_master(cluster):
    rule = minute_rule(5)
    buckets = [make_bucket(rule, token=scope_token("user", f"customer-{n}")) for n in range(100)]
    for bucket in buckets:
        assert take([bucket])[0]
    with cluster.nodes[0].client() as node:  # the server's own CLUSTER KEYSLOT agrees
        assert all(node.cluster("keyslot", b.key) == cluster.slot_of(b.key) for b in buckets[:10])
    held = {}
    for master in cluster.masters():
        with master.client() as client:
            held[master.port] = client.dbsize()
    print(f"\nbuckets of 100 identities per master: {sorted(held.values())}")
    assert sum(held.values()) == 100
    assert all(count >= 15 for count in held.values())  # about a third each


def test_reset_scan_and_the_config_version_work_on_the_cluster(cluster):
    rule, other_rule = minute_rule(5), minute_rule(5, endpoint="api:items")
    tokens = [scope_token("user", f"customer-{n}") for n in range(30)]
    for token in tokens:
        assert take([make_bucket(rule, token=token), make_bucket(other_rule, token=token)])[0]
    store = limiter().store
    found = set(store.scan("rl:{user.*"))
    assert len(found) == 30  # keys on every master are found (one per identity: 2 buckets each)
    assert {cluster.slot_of(key) for key in found} == {cluster.slot_of(bucket_key("rl", t))
                                                       for t in tokens}

    own = [make_bucket(r, token=tokens[0]).key for r in (rule, other_rule)]
    version_before = limiter().read_version()
    assert own[0] == own[1]  # both buckets in the identity's one key
    deleted, version = limiter().reset(own)
    assert deleted == 1 and version != version_before == "0"
    assert limiter().read_version() == version
    assert len(set(store.scan("rl:{user.*"))) == 29
    # keys of several slots: one DEL per slot
    assert store.delete([make_bucket(rule, token=t).key for t in tokens[1:4]]) == 3


# --- failover --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.django_db
def test_master_kill_under_load_no_500_and_served_again_soon_after_promotion(cluster, settings):
    """kill -9 the master of the global bucket's slot (every request's hot slot) while requests
    keep coming through the Django test client. cluster-node-timeout is 2 s."""
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP,
                              "CLUSTER_OPTIONS": {"socket_timeout": 0.5,
                                                  "socket_connect_timeout": 0.25}}
    load_demo_data()
    client = Client()
    served = []  # (monotonic time, status, not degraded)
    sequence = iter(range(10**6))

    def request():
        n = next(sequence)  # a new client IP each time: no bucket runs dry, no deny cache
        response = client.get("/api/items/", REMOTE_ADDR=f"10.{n // 65536 % 256}."
                                                          f"{n // 256 % 256}.{n % 256}")
        served.append((time.monotonic(), response.status_code, response.has_header("RateLimit")))
        return response

    for _ in range(20):
        assert request().has_header("RateLimit")
    hot_key = next(key for key in limiter().store.scan("rl:{global*"))
    promoted = {}

    def watch(old_master):
        promoted["after_s"] = cluster.wait_for_promotion(hot_key, old_master)
        promoted["at"] = time.monotonic()

    killed_at = time.monotonic()
    old_master = cluster.kill_master_of(hot_key)
    watcher = threading.Thread(target=watch, args=(old_master,))
    watcher.start()
    try:
        deadline = killed_at + 40
        while time.monotonic() < deadline:
            request()
            if "at" in promoted and served[-1][0] > promoted["at"] + 3 and served[-1][2]:
                break  # promoted a while ago and served again: measure below
        watcher.join(30)
        new_master = cluster.master_of(hot_key)
        noscript = new_master.client().info("errorstats").get("errorstat_NOSCRIPT", {})
    finally:
        watcher.join(30)
        cluster.restart_node(old_master)  # back as a replica; the session's cluster is healthy

    errors = [status for _, status, _ in served if status >= 500]
    during = [entry for entry in served if entry[0] > killed_at]
    last_degraded = max(i for i, (_, _, ok) in enumerate(during) if not ok)
    back_at = during[last_degraded + 1][0]  # from here on every decision was served
    recovery_s = back_at - promoted["at"]
    degraded = sum(1 for _, _, ok in during if not ok)
    print(f"\nmaster kill: promotion {promoted['after_s']:.1f} s after the kill; served again "
          f"{recovery_s:.2f} s after the promotion; {len(during)} responses since the kill, "
          f"{degraded} degraded (fail-open), {len(errors)} >= 500; NOSCRIPT on the new master: "
          f"{noscript.get('count', 0)}")
    assert errors == []
    assert degraded > 0  # the kill was felt
    assert recovery_s <= 10
    assert noscript.get("count", 0) >= 1  # the promoted replica had no script: handled


# --- loud misconfiguration -------------------------------------------------------------------

def store_messages():
    return {m.id: m for m in run_checks() if m.id in ("ratelimit_app.E006", "ratelimit_app.W004")}


def test_check_e006_for_a_single_node_store_pointed_at_a_cluster_node(cluster, settings):
    config = {key: value for key, value in settings.RATELIMIT_APP.items()
              if key not in ("CLUSTER_NODES", "CLUSTER_OPTIONS")}
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                          "LOCATION": cluster.nodes[0].url,
                          "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1}}}
    with override_settings(RATELIMIT_APP=config, CACHES=caches):
        found = store_messages()
    assert list(found) == ["ratelimit_app.E006"]
    assert "Redis Cluster node" in found["ratelimit_app.E006"].msg
    assert "CLUSTER_NODES" in found["ratelimit_app.E006"].hint


def test_check_passes_for_the_cluster_store_on_a_healthy_cluster(cluster):
    assert store_messages() == {}


def test_check_warns_when_the_cluster_is_unreachable_at_startup(cluster, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CLUSTER_NODES": ["127.0.0.1:1"]}
    found = store_messages()
    assert list(found) == ["ratelimit_app.W004"]
    assert "cannot be reached" in found["ratelimit_app.W004"].msg


def test_a_misconfigured_store_is_logged_at_error_level_with_the_cause(cluster, caplog):
    node = cluster.nodes[0]
    store = RedisStore(node.client())  # a single-node store on a cluster node
    tokens = token_per_master(cluster)
    buckets = [make_bucket(make_rule(), token=token) for token in tokens]
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"), \
            pytest.raises(StoreUnavailable) as raised:
        Limiter(limiter().config, store, metrics_autostart=False).peek_buckets(buckets)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and "misconfigured" in errors[0].getMessage()
    # the cause, the server's CROSSSLOT reply (a ClusterCrossSlotError in newer redis-py, a
    # ResponseError starting with the code in 5.3), in the server's words
    cause = raised.value.__cause__
    assert isinstance(cause, ClusterCrossSlotError) or reply_code(cause) == "CROSSSLOT"
    assert str(cause) and str(cause) in errors[0].getMessage()


def test_the_cluster_store_is_built_lazily_and_fails_as_unavailable(cluster):
    store = ClusterStore.from_nodes(["127.0.0.1:1"], {"socket_connect_timeout": 0.2})
    with pytest.raises(StoreUnavailable):
        store.take(["rl:{user.x}:1:user.x"], [b"", b"1", b"1000", b"5000", b"1", b"1000", b"1"],
                   version_key="v")
    assert store.problems() and "cannot be reached" in store.problems()[0]


def test_the_metrics_client_pipelines_what_the_flush_and_the_readers_send(cluster):
    """The metrics flush and readers use non-transactional pipelines of single-key commands on
    un-tagged keys (spread over the masters); RedisCluster's pipeline sends each node its own.
    (The commands of ratelimit_app/metrics/flush.py and reads.py, without importing them.)"""
    client = limiter().store.metrics_client()
    keys = [f"rl:m:c:minute:{n}" for n in range(12)]
    assert len({cluster.slot_of(key) for key in keys}) > 1
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hincrby(key, "rule|free-ip|allowed", 2)
        pipe.expire(key, 60)
        pipe.zincrby(key + ":hot", 3, "ip.abc")
        pipe.zremrangebyrank(key + ":hot", 0, -101)
        pipe.zadd(key + ":near", {"ip.abc|rule|1|5": 1.5})
    pipe.set("rl:m:flushed", b"1.0", ex=60)
    pipe.lpush("rl:m:buffered", b"{}")
    pipe.ltrim("rl:m:buffered", 0, 19)
    assert len(pipe) == 5 * len(keys) + 3
    pipe.execute()
    reads = client.pipeline(transaction=False)
    for key in keys:
        reads.hmget(key, ["rule|free-ip|allowed"])
        reads.hgetall(key)
        reads.zrange(key + ":hot", 0, -1, withscores=True)
    replies = reads.execute()
    assert replies[0::3] == [[b"2"]] * len(keys)
    assert replies[2::3] == [[(b"ip.abc", 3.0)]] * len(keys)
