"""2. Redis CPU per decision: ``usec_per_call`` of EVALSHA in INFO commandstats (the script's whole
run inside Redis), ours vs the naive script, 1 to 6 levels. Also the redis.call count per call."""

from . import alternatives
from .harness import median, table, verdict

TARGET_US = 10.0


def _measure(client, fn, calls):
    client.config_resetstat()
    for _ in range(calls):
        fn()
    stats = client.info("commandstats")
    evalsha = stats["cmdstat_evalsha"]
    inner = sum(v["calls"] for k, v in stats.items()
                if k not in ("cmdstat_evalsha", "cmdstat_config|resetstat"))
    return evalsha["usec_per_call"], inner / evalsha["calls"]


def run(env, quick):
    client = env.client()
    variants = {}
    for depth in range(1, 7):
        variants[("ours", depth)] = alternatives.ours(env.users[depth])
        variants[("naive", depth)] = alternatives.floor(f"cpu-{depth}", depth)
    rounds, calls = (3, 500) if quick else (7, 2000)
    for fn in variants.values():
        fn()
    cpu = {name: [] for name in variants}
    inner_calls = {}
    for _ in range(rounds):
        for name, fn in variants.items():
            usec, inner = _measure(client, fn, calls)
            cpu[name].append(usec)
            inner_calls[name] = inner
    rows, results = [], {}
    for depth in range(1, 7):
        ours, naive = median(cpu[("ours", depth)]), median(cpu[("naive", depth)])
        rows.append([depth, ours, f"{inner_calls[('ours', depth)]:.0f}", naive,
                     f"{inner_calls[('naive', depth)]:.0f}", f"{ours / naive:.2f}×"])
        results[depth] = {"ours_us": ours, "naive_us": naive, "ours_samples": cpu[("ours", depth)],
                          "naive_samples": cpu[("naive", depth)],
                          "ours_redis_calls": inner_calls[("ours", depth)],
                          "naive_redis_calls": inner_calls[("naive", depth)]}
    markdown = table(["levels", "ours µs (Redis CPU)", "ours redis.calls", "naive µs",
                      "naive redis.calls", "ours ÷ naive"], rows)
    four = results[4]["ours_us"]
    targets = [("2. Redis CPU ≤ 10 µs per 4-level decision", f"{four:.1f} µs",
                verdict(four <= TARGET_US))]
    return {"title": "2. Redis CPU per decision (INFO commandstats, evalsha usec_per_call)",
            "markdown": markdown, "results": results, "targets": targets}
