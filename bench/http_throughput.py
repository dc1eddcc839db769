"""3. HTTP throughput: gunicorn (2 sync workers) + wrk (32 connections), the same DRF view with
each throttle, runs interleaved (A B C D E A B C D E …). Every request is allowed."""

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


def run(env, quick):
    rounds, seconds = (2, 3) if quick else (4, 6)
    running = servers.start_all(VARIANTS)
    samples = {v: [] for v in VARIANTS}
    non_2xx = {v: 0 for v in VARIANTS}
    try:
        for server in running.values():
            servers.wrk(server.url(), 1)  # warm up both workers
        names = list(VARIANTS)
        for round_number in range(rounds):
            shift = round_number % len(names)
            for variant in names[shift:] + names[:shift]:
                result = servers.wrk(running[variant].url(), seconds)
                samples[variant].append(result["rps"])
                non_2xx[variant] += result["non_2xx"]
            env.client().flushall()  # keep DRF's history and the buckets from growing
    finally:
        servers.stop_all(running)

    def paired(name, baseline):
        return median([a / b for a, b in zip(samples[name], samples[baseline])])

    rows, results = [], {}
    for variant, label in VARIANTS.items():
        rows.append([label, median(samples[variant]), f"{paired(variant, 'none'):.2f}",
                     f"{paired('ours', variant):.2f}×", non_2xx[variant]])
        results[variant] = {"label": label, "rps_median": median(samples[variant]),
                            "rps_samples": samples[variant], "non_2xx": non_2xx[variant]}
    vs_lua, vs_drf, vs_drf_min = paired("ours", "lua"), paired("ours", "drf"), paired("ours", "drf-min")
    markdown = table(["variant", "req/s (median)", "÷ no throttle", "ours ÷ this", "non-2xx"],
                     rows)
    targets = [("3. HTTP: ours ≥ 0.95× a bare Lua throttle", f"{vs_lua:.2f}×",
                verdict(vs_lua >= 0.95)),
               ("3. HTTP: ours ≥ 1.4× DRF AnonRateThrottle (rate per minute)",
                f"{vs_drf_min:.2f}×", verdict(vs_drf_min >= 1.4)),
               ("3. HTTP: ours ≥ 1.4× DRF AnonRateThrottle (rate per second)", f"{vs_drf:.2f}×",
                verdict(vs_drf >= 1.4))]
    return {"title": f"3. HTTP (gunicorn 2 sync workers, wrk 32 connections, {seconds} s × "
                     f"{rounds} rounds each)", "markdown": markdown, "results": results,
            "targets": targets}
