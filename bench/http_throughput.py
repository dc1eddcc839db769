"""3. HTTP throughput: gunicorn (2 sync workers) + wrk (32 connections), the same DRF view with
each throttle, runs interleaved in rounds (see ``round_order``). Every request is allowed.
ASGI rows: uvicorn (2 workers) with no throttle, a bare async Lua throttle and ours (both
deciding on the event loop in an async middleware), each serving an ``async def`` Django view
and the DRF view (run in a thread, as Django runs sync views under ASGI), and the two floors of
the async view's row (ours' take.lua call alone, then with ours' header fields:
bench/throttles.py); all rows interleaved in one run. The async view's throughput target is
relative to the first floor, the one Redis call every exact limiter pays, not to no throttle."""

import math

from . import servers
from .harness import (
    interval_text,
    median,
    median_interval,
    paired_ratio,
    round_ratios,
    table,
    verdict,
)

VARIANTS = {
    "none": "no throttle",
    "ours": "ours (QuotaThrottle, 4 levels, headers)",
    "lua": "bare 4-key Lua throttle",
    "drf": "DRF AnonRateThrottle (one hot client, rate per second)",
    "drf-min": "DRF AnonRateThrottle (one hot client, rate per minute)",
    "ratelimit": "django-ratelimit",
}
# the ASGI servers (compare each with the no-throttle server of its own kind: Django's ASGI
# path is much slower than gunicorn's sync workers whatever the throttle)
ASGI_SERVERS = {"none-asgi": "no throttle", "lua-asgi": "bare 4-key Lua throttle (async "
                "middleware, redis.asyncio)", "ours-asgi": "ours (async middleware decides)"}
ASGI_VIEWS = {"async": ("/aitem/", "async def view"), "drf": ("/item/", "DRF view")}
# what the async view's row cannot go below on this machine: ours' one take.lua call alone
# (the async view's throughput target is measured against it), and with the RateLimit-Policy
# and RateLimit fields ours sends
ASGI_FLOORS = {"take-asgi": "floor: ours' take.lua call alone (no policy, no fields)",
               "take-fields-asgi": "floor: ours' take.lua call and ours' header fields"}
# their ratios' names in the JSON (asgi.floor.<name>_vs_none)
FLOOR_RATIO_NAMES = {"take-asgi": "take_alone", "take-fields-asgi": "take_and_fields"}
# run name -> (server, path); the WSGI runs all serve the DRF view
RUNS = {**{name: (name, "/item/") for name in VARIANTS},
        **{f"{server}-{kind}": (server, path) for server in ASGI_SERVERS
           for kind, (path, _) in ASGI_VIEWS.items()},
        **{f"{server}-async": (server, ASGI_VIEWS["async"][0]) for server in ASGI_FLOORS}}
LABELS = {**VARIANTS, **{f"{server}-{kind}": f"ASGI {view}: {label}"
                         for server, label in ASGI_SERVERS.items()
                         for kind, (_, view) in ASGI_VIEWS.items()},
          **{f"{server}-async": f"ASGI async def view: {label}"
             for server, label in ASGI_FLOORS.items()}}
# The runs in groups whose rows are divided by one another (a server kind and a view), each
# group's baseline next to ours: a ratio's two runs are seconds apart, not a whole round.
ROUND_GROUPS = (
    ("none", "ours", "drf", "lua", "drf-min", "ratelimit"),
    ("none-asgi-async", "ours-asgi-async", "take-asgi-async", "take-fields-asgi-async",
     "lua-asgi-async"),
    ("none-asgi-drf", "ours-asgi-drf", "lua-asgi-drf"),
)
# issue 19: the CPU ours adds per request under ASGI, over what it adds under WSGI; the async
# view's req/s over that of ours' take.lua call alone
ASGI_OVERHEAD_LIMIT, ASGI_VS_TAKE_ALONE_LIMIT = 1.25, 0.95


def start_asgi(running):
    """Add the ASGI servers to ``running`` (stopping them all if one fails)."""
    try:
        for name in [*ASGI_SERVERS, *ASGI_FLOORS]:
            running[name] = servers.Uvicorn(name.removesuffix("-asgi")).start()
    except Exception:
        servers.stop_all(running)
        raise


def run(env, quick):
    # many short rounds: the noisiest section, and noise on this shared VM drifts over tens of
    # seconds, so pairs measured close together compare better than long runs far apart
    rounds, seconds = (2, 3) if quick else (12, 3)
    running = servers.start_all(VARIANTS)
    start_asgi(running)
    labels = LABELS
    samples = {v: [] for v in labels}
    cpu = {v: [] for v in labels}    # CPU µs per request: the server's workers and Redis
    redis_cpu = {v: [] for v in labels}  # the part of it that was Redis's
    idle = {v: [] for v in labels}   # the machine's idle share during the run
    non_2xx = {v: 0 for v in labels}
    redis_pid = env.redis.process.pid
    try:
        for server_name, path in RUNS.values():
            servers.wrk(running[server_name].url(path), 1)  # warm up both workers
        for round_number in range(rounds):
            for variant in round_order(ROUND_GROUPS, round_number):
                server, path = running[RUNS[variant][0]], RUNS[variant][1]
                workers = server.worker_pids()
                workers_before, redis_before = _cpu_used(workers), servers.cpu_seconds(redis_pid)
                idle_before = _machine_idle()
                result = servers.wrk(server.url(path), seconds)
                redis_used = servers.cpu_seconds(redis_pid) - redis_before
                cpu_used = _cpu_used(workers) - workers_before + redis_used
                idle[variant].append(_share(idle_before, _machine_idle()))
                samples[variant].append(result["rps"])
                requests = max(result["requests"], 1)
                cpu[variant].append(cpu_used / requests * 1e6)
                redis_cpu[variant].append(redis_used / requests * 1e6)
                non_2xx[variant] += result["non_2xx"]
            env.client().flushall()  # keep DRF's history and the buckets from growing
    finally:
        servers.stop_all(running)

    def paired(name, baseline):
        return paired_ratio(samples, name, baseline)

    def baseline(variant):
        """The no-throttle run of the same server kind and view."""
        return "none-asgi-" + variant.rsplit("-", 1)[1] if "-asgi-" in variant else "none"

    def ours_of(variant):
        """Ours on the same server kind and view."""
        return "ours-asgi-" + variant.rsplit("-", 1)[1] if "-asgi-" in variant else "ours"

    rows, results = [], {}
    for variant, label in labels.items():
        rows.append([label, median(samples[variant]), f"{paired(variant, baseline(variant)):.2f}",
                     f"{paired(ours_of(variant), variant):.2f}×", f"{median(cpu[variant]):.0f}",
                     f"{median(idle[variant]):.0%}", non_2xx[variant]])
        results[variant] = {"label": label, "rps_median": median(samples[variant]),
                            "rps_samples": samples[variant], "non_2xx": non_2xx[variant],
                            "cpu_us_per_request_median": median(cpu[variant]),
                            "cpu_us_per_request_samples": cpu[variant],
                            "redis_cpu_us_per_request_median": median(redis_cpu[variant]),
                            "machine_idle_median": median(idle[variant])}
    vs_lua = paired("ours", "lua")
    # the throttle's own cost per request: 1/throughput with it minus 1/throughput without
    overhead_rounds = [(1 / ours - 1 / none) / (1 / drf - 1 / none) for ours, drf, none in
                       zip(samples["ours"], samples["drf"], samples["none"])]
    overhead = median(overhead_rounds)
    # how far the borderline medians could move with other rounds (not part of the verdicts)
    intervals = {"http.overhead_vs_drf_second": median_interval(overhead_rounds),
                 "asgi.vs_none.async_view": median_interval(
                     round_ratios(samples, "ours-asgi-async", "none-asgi-async")),
                 "asgi.vs_take_alone": median_interval(
                     round_ratios(samples, "ours-asgi-async", "take-asgi-async"))}
    # the same on CPU alone (workers + Redis per request, medians): what the throttle costs
    # apart from the time workers sit blocked on Redis (see docs/explanation/performance.md)
    cpu_none = median(cpu["none"])
    ours_cpu, drf_cpu = median(cpu["ours"]) - cpu_none, median(cpu["drf"]) - cpu_none
    cpu_overhead = ours_cpu / drf_cpu
    ratios = {"http.vs_bare_lua": vs_lua, "http.overhead_vs_drf_second": overhead,
              "http.vs_drf_minute": paired("ours", "drf-min"),
              "http.cpu_overhead_vs_drf_second": cpu_overhead}
    asgi_lines, asgi_targets = asgi_ratios(samples, cpu, redis_cpu, ours_cpu, paired, ratios,
                                           intervals["asgi.vs_take_alone"])
    markdown = table(["variant", "req/s (median)", "÷ no throttle", "ours ÷ this",
                      "CPU µs/request (workers + Redis)", "machine idle", "non-2xx"], rows)
    markdown += (f"\n\nCPU overhead (not a target): ours {ours_cpu:.0f} µs per request, DRF per "
                 f"second {drf_cpu:.0f} µs: {cpu_overhead:.2f}×.")
    markdown += "\n\n" + "\n".join(asgi_lines)
    targets = [("3. HTTP: ours ≥ 1.0× a bare 4-key Lua throttle (req/s)", f"{vs_lua:.2f}×",
                verdict(vs_lua >= 1.0)),
               ("3. HTTP: ours' overhead ≤ 0.6× DRF AnonRateThrottle's (rate per second; "
                "1/req/s − 1/no-throttle req/s)",
                f"{overhead:.2f}×{interval_text(intervals['http.overhead_vs_drf_second'])}",
                verdict(overhead <= 0.6)),
               *asgi_targets]
    return {"title": f"3. HTTP (gunicorn 2 sync workers, wrk 32 connections, {seconds} s × "
                     f"{rounds} rounds each)", "markdown": markdown, "results": results,
            "ratios": ratios, "intervals_90": intervals, "targets": targets}


def round_order(groups, round_number):
    """The runs of round ``round_number``: each group's runs one after the other, the groups
    taking turns to go first (the first runs after the buckets were flushed), every other
    round backwards. The noise on this shared machine drifts over tens of seconds: a ratio's
    two runs measured side by side, in one order in a round and the other in the next (A B,
    then B A), cancels a drift that runs the same way over both rounds, which a fixed order
    would read as a difference between the variants."""
    shift = round_number % len(groups)
    backwards = round_number % 2 == 1
    return [name for group in groups[shift:] + groups[:shift]
            for name in (reversed(group) if backwards else group)]


def asgi_ratios(samples, cpu, redis_cpu, wsgi_overhead_cpu, paired, ratios,
                vs_take_alone_interval):
    """Add the ASGI ratios to ``ratios``; return (markdown lines, target rows).

    The overhead of a throttle is the CPU (workers + Redis, µs per request, medians) its server
    spends over the no-throttle server of the same kind serving the same view."""
    lines, targets = [], []
    floors = {}
    for server in ASGI_FLOORS:
        floors[server] = ratios[f"asgi.floor.{FLOOR_RATIO_NAMES[server]}_vs_none"] = \
            paired(f"{server}-async", "none-asgi-async")
    lines.append("ASGI, async def view, the floors: ours' take.lua call alone "
                 f"{floors['take-asgi']:.2f}× no throttle (req/s), with ours' header fields "
                 f"{floors['take-fields-asgi']:.2f}×; ours "
                 f"{paired('ours-asgi-async', 'none-asgi-async'):.2f}× no throttle, "
                 f"{paired('ours-asgi-async', 'take-asgi-async'):.2f}× the call alone.")
    cost = floor_cost(cpu, redis_cpu, "take-asgi-async", "none-asgi-async")
    ratios["asgi.floor.take_alone_cpu_vs_none"] = cost["cpu_vs_none"]
    lines.append(f"ASGI, async def view: ours' take.lua call alone costs "
                 f"{cost['cpu_vs_none']:.3f}× no throttle's CPU per request (workers + Redis: "
                 f"{cost['added_us']:+.0f} µs over {cost['none_us']:.0f} µs, Redis "
                 f"{cost['redis_added_us']:+.0f} µs); ours ≥ {ASGI_VS_TAKE_ALONE_LIMIT}× "
                 f"its req/s allows ours about {1 / ASGI_VS_TAKE_ALONE_LIMIT:.3f}× its CPU per "
                 f"request.")
    for kind, (_, view) in ASGI_VIEWS.items():
        none = median(cpu[f"none-asgi-{kind}"])
        ours, lua = (median(cpu[f"{name}-asgi-{kind}"]) - none for name in ("ours", "lua"))
        vs_wsgi = ours / wsgi_overhead_cpu if wsgi_overhead_cpu > 0 else float("inf")
        ratios[f"asgi.overhead_vs_wsgi_overhead.{kind}_view"] = vs_wsgi
        ratios[f"asgi.vs_bare_lua.{kind}_view"] = paired(f"ours-asgi-{kind}", f"lua-asgi-{kind}")
        ratios[f"asgi.vs_none.{kind}_view"] = paired(f"ours-asgi-{kind}", f"none-asgi-{kind}")
        lines.append(f"ASGI, {view}: ours adds {ours:.0f} µs CPU per request over no throttle "
                     f"(the bare async Lua throttle {lua:.0f} µs; ours under WSGI "
                     f"{wsgi_overhead_cpu:.0f} µs): {vs_wsgi:.2f}× the WSGI overhead; req/s "
                     f"{ratios[f'asgi.vs_none.{kind}_view']:.2f}× no throttle, "
                     f"{ratios[f'asgi.vs_bare_lua.{kind}_view']:.2f}× the bare Lua throttle.")
        targets.append((f"3. ASGI ({view}): ours' CPU overhead ≤ {ASGI_OVERHEAD_LIMIT}× ours "
                        f"under WSGI (each over its own no-throttle server)", f"{vs_wsgi:.2f}×",
                        verdict(vs_wsgi <= ASGI_OVERHEAD_LIMIT)))
    ratios["asgi.vs_none"] = ratios["asgi.vs_none.async_view"]  # (no longer a target)
    # the target: against the one Redis call every exact limiter pays, not an empty view (the
    # call alone costs about all of 1 / 0.95 over no throttle: docs/explanation/performance.md)
    vs_take = ratios["asgi.vs_take_alone"] = paired("ours-asgi-async", "take-asgi-async")
    targets.append((f"3. ASGI (async def view): ours ≥ {ASGI_VS_TAKE_ALONE_LIMIT}× ours' "
                    f"take.lua call alone (req/s; the floor every exact limiter pays)",
                    f"{vs_take:.2f}×{interval_text(vs_take_alone_interval)}",
                    verdict(vs_take >= ASGI_VS_TAKE_ALONE_LIMIT)))
    ratios["asgi.overhead_vs_wsgi_overhead"] = max(
        ratios[f"asgi.overhead_vs_wsgi_overhead.{kind}_view"] for kind in ASGI_VIEWS)
    return lines, targets


def floor_cost(cpu, redis_cpu, floor, none):
    """What the run ``floor`` costs over the run ``none`` in CPU µs per request (medians of
    the rounds): {"none_us", "added_us", "redis_added_us", "cpu_vs_none"}. A throttle whose
    server spends k times no throttle's CPU per request serves about 1/k of its requests per
    second on a machine the load keeps busy, so the floor's ``cpu_vs_none`` is about the best
    ratio any throttle making that call can reach."""
    none_us, floor_us = median(cpu[none]), median(cpu[floor])
    return {"none_us": none_us, "added_us": floor_us - none_us,
            "redis_added_us": median(redis_cpu[floor]) - median(redis_cpu[none]),
            "cpu_vs_none": floor_us / none_us if none_us > 0 else math.inf}


def _cpu_used(pids):
    return sum(map(servers.cpu_seconds, pids))


def _machine_idle():
    """Return (idle, total) jiffies of all CPUs so far (/proc/stat; idle counts iowait)."""
    with open("/proc/stat") as stat:
        jiffies = [int(value) for value in stat.readline().split()[1:9]]
    return jiffies[3] + jiffies[4], sum(jiffies)


def _share(before, after):
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total else 0.0
