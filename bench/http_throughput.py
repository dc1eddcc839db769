"""3. HTTP throughput: gunicorn (2 sync workers) + wrk (32 connections), the same DRF view with
each throttle, runs interleaved (A B C D E A B C D E …). Every request is allowed. ASGI rows:
ours under uvicorn (2 workers; the middleware decides on the event loop) beside the same server
without a throttle."""

from . import servers
from .harness import median, table, verdict

VARIANTS = {
    "none": "no throttle",
    "ours": "ours (QuotaThrottle, 4 levels, headers)",
    "lua": "bare 4-key Lua throttle",
    "drf": "DRF AnonRateThrottle (one hot client, rate per second)",
    "drf-min": "DRF AnonRateThrottle (one hot client, rate per minute)",
    "ratelimit": "django-ratelimit",
}
# the ASGI rows: ours, and the same server without a throttle (Django's ASGI path with a sync
# DRF view is much slower than gunicorn's sync workers: compare ours-asgi with none-asgi)
ASGI_VARIANTS = {"none-asgi": "no throttle, ASGI (uvicorn 2 workers)",
                 "ours-asgi": "ours, ASGI (uvicorn 2 workers, async middleware decides)"}


def start_asgi(running):
    """Add the ASGI rows' servers to ``running`` (stopping them all if one fails)."""
    try:
        for name in ASGI_VARIANTS:
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
    labels = {**VARIANTS, **ASGI_VARIANTS}
    samples = {v: [] for v in labels}
    cpu = {v: [] for v in labels}    # CPU µs per request: the server's workers and Redis
    idle = {v: [] for v in labels}   # the machine's idle share during the run
    non_2xx = {v: 0 for v in labels}
    redis_pid = env.redis.process.pid
    try:
        for server in running.values():
            servers.wrk(server.url(), 1)  # warm up both workers
        names = list(labels)
        for round_number in range(rounds):
            shift = round_number % len(names)
            for variant in names[shift:] + names[:shift]:
                processes = running[variant].worker_pids() + [redis_pid]
                cpu_before, idle_before = _cpu_used(processes), _machine_idle()
                result = servers.wrk(running[variant].url(), seconds)
                cpu_used = _cpu_used(processes) - cpu_before
                idle[variant].append(_share(idle_before, _machine_idle()))
                samples[variant].append(result["rps"])
                cpu[variant].append(cpu_used / max(result["requests"], 1) * 1e6)
                non_2xx[variant] += result["non_2xx"]
            env.client().flushall()  # keep DRF's history and the buckets from growing
    finally:
        servers.stop_all(running)

    def paired(name, baseline):
        return median([a / b for a, b in zip(samples[name], samples[baseline])])

    rows, results = [], {}
    for variant, label in labels.items():
        rows.append([label, median(samples[variant]), f"{paired(variant, 'none'):.2f}",
                     f"{paired('ours', variant):.2f}×", f"{median(cpu[variant]):.0f}",
                     f"{median(idle[variant]):.0%}", non_2xx[variant]])
        results[variant] = {"label": label, "rps_median": median(samples[variant]),
                            "rps_samples": samples[variant], "non_2xx": non_2xx[variant],
                            "cpu_us_per_request_median": median(cpu[variant]),
                            "cpu_us_per_request_samples": cpu[variant],
                            "machine_idle_median": median(idle[variant])}
    vs_lua = paired("ours", "lua")
    # the throttle's own cost per request: 1/throughput with it minus 1/throughput without
    overhead = median([(1 / ours - 1 / none) / (1 / drf - 1 / none) for ours, drf, none in
                       zip(samples["ours"], samples["drf"], samples["none"])])
    # the same on CPU alone (workers + Redis per request, medians): what the throttle costs
    # apart from the time workers sit blocked on Redis (see docs/explanation/performance.md)
    cpu_none = median(cpu["none"])
    ours_cpu, drf_cpu = median(cpu["ours"]) - cpu_none, median(cpu["drf"]) - cpu_none
    cpu_overhead = ours_cpu / drf_cpu
    ratios = {"http.vs_bare_lua": vs_lua, "http.overhead_vs_drf_second": overhead,
              "http.vs_drf_minute": paired("ours", "drf-min"),
              "http.cpu_overhead_vs_drf_second": cpu_overhead}
    markdown = table(["variant", "req/s (median)", "÷ no throttle", "ours ÷ this",
                      "CPU µs/request (workers + Redis)", "machine idle", "non-2xx"], rows)
    markdown += (f"\n\nCPU overhead (not a target): ours {ours_cpu:.0f} µs per request, DRF per "
                 f"second {drf_cpu:.0f} µs: {cpu_overhead:.2f}×.")
    targets = [("3. HTTP: ours ≥ 1.0× a bare 4-key Lua throttle (req/s)", f"{vs_lua:.2f}×",
                verdict(vs_lua >= 1.0)),
               ("3. HTTP: ours' overhead ≤ 0.6× DRF AnonRateThrottle's (rate per second; "
                "1/req/s − 1/no-throttle req/s)", f"{overhead:.2f}×", verdict(overhead <= 0.6))]
    return {"title": f"3. HTTP (gunicorn 2 sync workers, wrk 32 connections, {seconds} s × "
                     f"{rounds} rounds each)", "markdown": markdown, "results": results,
            "ratios": ratios, "targets": targets}


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
