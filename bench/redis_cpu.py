"""2. Redis CPU per decision: ``usec_per_call`` of EVALSHA in INFO commandstats (the script's whole
run inside Redis), ours vs the naive script, 1 to 6 levels, plus the redis.call count per call.

Measured two ways. *Under load*: the exact calls of a decision (ours: the keys and arguments the
engine builds; naive: its own) are sent back to back in pipelines, as a busy Redis receives them;
this is the CPU a decision costs a loaded server, and what the target is judged on. *One at a
time*: one call per round trip through the whole path; an idle Redis wakes up for every call, so
cache misses inflate both columns alike on a shared VM.
"""

from django.test import RequestFactory
from django.urls import resolve

from ratelimit_app.decision import engine
from ratelimit_app.decision.identity import identify
from ratelimit_app.runtime import guard
from ratelimit_app.runtime.limiter import default_limiter
from ratelimit_app.stores.ban_checks import folded_call

from . import alternatives, naive
from .harness import median, table, verdict

TARGET = 0.6  # ours ÷ naive, 4 levels, under load
PIPELINE = 100


def _stats(client, calls):
    """Return (EVALSHA usec per call, redis.calls per EVALSHA, EVALSHA per decision)."""
    stats = client.info("commandstats")
    evalsha = stats["cmdstat_evalsha"]
    inner = sum(v["calls"] for k, v in stats.items()
                if k not in ("cmdstat_evalsha", "cmdstat_config|resetstat"))
    return evalsha["usec_per_call"], inner / evalsha["calls"], evalsha["calls"] / calls


def _one_at_a_time(client, fn, calls):
    client.config_resetstat()
    for _ in range(calls):
        fn()
    return _stats(client, calls)


def _under_load(client, sha, keys, args, calls):
    client.config_resetstat()
    pipe = client.pipeline(transaction=False)
    for i in range(1, calls + 1):
        pipe.evalsha(sha, len(keys), *keys, *args)
        if i % PIPELINE == 0:
            pipe.execute()
    pipe.execute()
    return _stats(client, calls)


def _our_call(user):
    """The keys and arguments of one decision for ``user``, exactly as the store sends them
    (its ban checks folded: stores/ban_checks.py)."""
    request = RequestFactory().get("/item/", REMOTE_ADDR="10.1.2.3")
    request.resolver_match = resolve("/item/")
    limiter = default_limiter()
    snapshot = limiter.snapshot()
    identity = identify(request, user, snapshot)
    endpoint = guard.endpoint_name(request)
    buckets = engine.plan_buckets(snapshot, identity, endpoint,
                                  engine.request_cost(snapshot, request, endpoint, identity.plan))
    keys, args, _ = folded_call(buckets.keys, tuple(engine.take_args(buckets)),
                                limiter.version_key)
    return limiter.store.take_sha, list(keys), list(args)


def run(env, quick):
    client = env.client()
    sequential, loaded = {}, {}
    for depth in range(1, 7):
        sequential[("ours", depth)] = alternatives.ours(env.users[depth])
        sequential[("naive", depth)] = alternatives.floor(f"cpu-{depth}", depth)
        loaded[("ours", depth)] = _our_call(env.users[depth])
        keys, args = naive.naive_keys(f"cpu-{depth}", depth), naive.naive_args(depth)
        loaded[("naive", depth)] = (naive.script().sha, keys, args)
    rounds, calls = (3, 500) if quick else (7, 2000)
    for fn in sequential.values():
        fn()  # loads both scripts
    cpu_seq = {name: [] for name in sequential}
    cpu_load = {name: [] for name in loaded}
    inner_calls, round_trips = {}, {}
    for _ in range(rounds):  # interleaved: every variant once per round
        for name in loaded:
            usec, inner, _ = _under_load(client, *loaded[name], calls * 2)
            cpu_load[name].append(usec)
            inner_calls[name] = inner
            usec, _, per_decision = _one_at_a_time(client, sequential[name], calls)
            cpu_seq[name].append(usec)
            round_trips[name] = max(round_trips.get(name, 0), per_decision)
    rows, results = [], {}
    for depth in range(1, 7):
        ours, naive_us = median(cpu_load[("ours", depth)]), median(cpu_load[("naive", depth)])
        ours_seq, naive_seq = median(cpu_seq[("ours", depth)]), median(cpu_seq[("naive", depth)])
        rows.append([depth, ours, f"{inner_calls[('ours', depth)]:.0f}", naive_us,
                     f"{inner_calls[('naive', depth)]:.0f}", f"{ours / naive_us:.2f}×",
                     ours_seq, naive_seq])
        results[depth] = {
            "ours_us": ours, "naive_us": naive_us, "ours_one_at_a_time_us": ours_seq,
            "naive_one_at_a_time_us": naive_seq, "ours_samples": cpu_load[("ours", depth)],
            "naive_samples": cpu_load[("naive", depth)],
            "ours_redis_calls": inner_calls[("ours", depth)],
            "naive_redis_calls": inner_calls[("naive", depth)]}
    markdown = table(["levels", "ours µs under load", "ours redis.calls", "naive µs under load",
                      "naive redis.calls", "ours ÷ naive", "ours µs one at a time",
                      "naive µs one at a time"], rows)
    vs_naive = median([a / b for a, b in zip(cpu_load[("ours", 4)], cpu_load[("naive", 4)])])
    trips = max(round_trips[("ours", depth)] for depth in range(1, 7))
    ratios = {"redis_cpu.vs_naive": vs_naive, "redis_cpu.evalsha_per_decision": trips}
    targets = [(f"2. Redis CPU per 4-level decision (under load): ours ≤ {TARGET}× the naive "
                f"script", f"{vs_naive:.2f}× ({results[4]['ours_us']:.1f} vs "
                f"{results[4]['naive_us']:.1f} µs)", verdict(vs_naive <= TARGET)),
               ("5. one round trip (EVALSHA) per decision on a single node, 1–6 levels",
                f"{trips:.2f}", verdict(trips == 1))]
    return {"title": "2. Redis CPU per decision (INFO commandstats, evalsha usec_per_call)",
            "markdown": markdown, "results": results, "ratios": ratios, "targets": targets}
