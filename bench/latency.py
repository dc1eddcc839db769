"""3. Latency at a fixed request rate: p50 / p99 / p99.9 of the response time of each variant,
WSGI (gunicorn, 2 sync workers, the DRF view) and ASGI (uvicorn, 2 workers, the async def view),
at the same rate for every variant of a server kind: half of what that kind's no-throttle
server serves flat out (measured with wrk at the start of the section).

The load generator is Debian's ``hey``: ``-c`` workers each sending ``-q`` requests per second
for ``-z`` seconds, ``-o csv`` writing every request's response time (so p99.9 is computed here;
hey's own summary stops at p99). wrk2, the usual open-loop tool, is not packaged by Debian;
``h2load --rps`` is (nghttp2-client), but paces each client the same way and gunicorn's sync
workers close the connection after every response, which Go's client simply reopens. hey is
closed-loop per worker (a worker sends its next request only after the previous answer), so
it is made nearly open-loop by using many workers, each at a low rate: at 64 workers a worker
sends every ~50 ms while a response takes a few ms, so a slow response delays only its own
worker's next request, and the rate holds.

The figure that matters is the p99 a throttle adds over the no-throttle server of the same
kind; ours is compared with the bare 4-key Lua throttle's.
"""

import csv
import io
import subprocess

from . import servers
from .harness import table, verdict

WORKERS = 64
LOAD_SHARE = 0.5  # of the no-throttle server's capacity
KINDS = {  # kind -> (server names by variant, path, label)
    "wsgi": ({"none": "none", "lua": "lua", "ours": "ours"}, "/item/",
             "WSGI (gunicorn 2 sync workers), DRF view"),
    "asgi": ({"none": "none-asgi", "lua": "lua-asgi", "ours": "ours-asgi"}, "/aitem/",
             "ASGI (uvicorn 2 workers), async def view"),
}
VARIANT_LABELS = {"none": "no throttle", "lua": "bare 4-key Lua throttle", "ours": "ours"}
P99_ADDED_LIMIT = 1.1  # ours' added p99 over the bare Lua throttle's (issue 19)


def start_servers():
    """Start the gunicorn and uvicorn servers of every kind; return {name: server}."""
    running = {}
    try:
        for kind, (names, _, _) in KINDS.items():
            for variant, name in names.items():
                server = servers.Uvicorn(variant) if kind == "asgi" else servers.Gunicorn(variant)
                running[name] = server.start()
    except Exception:
        servers.stop_all(running)
        raise
    return running


def hey(url, rate, seconds, workers=WORKERS):
    """Send ``rate`` requests per second in all for ``seconds`` with hey; return (response
    times in ms, non-2xx count, requests sent)."""
    out = subprocess.run(
        ["hey", "-z", f"{seconds}s", "-c", str(workers), "-q", f"{rate / workers:.3f}",
         "-t", "10", "-o", "csv", url],
        capture_output=True, text=True, timeout=seconds + 60, check=True).stdout
    times, failed = [], 0
    for row in csv.DictReader(io.StringIO(out)):
        times.append(float(row["response-time"]) * 1000)
        if not row["status-code"].startswith("2"):
            failed += 1
    return times, failed, len(times)


def percentile(values, share):
    """The ``share`` (0..1) percentile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def run(env, quick):
    rounds, seconds = (1, 4) if quick else (4, 8)
    running = start_servers()
    times = {name: [] for name in running}
    failed = {name: 0 for name in running}
    rates = {}
    try:
        for kind, (names, path, _) in KINDS.items():
            for name in names.values():
                servers.wrk(running[name].url(path), 1)  # warm up both workers
            capacity = servers.wrk(running[names["none"]].url(path), 3)["rps"]
            rates[kind] = round(capacity * LOAD_SHARE)
        order = [(kind, name) for kind, (names, _, _) in KINDS.items() for name in names.values()]
        for round_number in range(rounds):
            shift = round_number % len(order)
            for kind, name in order[shift:] + order[:shift]:
                sent, bad, _ = hey(running[name].url(KINDS[kind][1]), rates[kind], seconds)
                times[name] += sent
                failed[name] += bad
            env.client().flushall()
    finally:
        servers.stop_all(running)

    rows, results, ratios, targets = [], {}, {}, []
    for kind, (names, _, label) in KINDS.items():
        p = {variant: {share: percentile(times[name], share) for share in (0.5, 0.99, 0.999)}
             for variant, name in names.items()}
        for variant, name in names.items():
            added = p[variant][0.99] - p["none"][0.99]
            rows.append([label, VARIANT_LABELS[variant], rates[kind], len(times[name]),
                         p[variant][0.5], p[variant][0.99], p[variant][0.999],
                         f"{added:+.2f}", failed[name]])
            results[name] = {"rate_rps": rates[kind], "requests": len(times[name]),
                             "p50_ms": p[variant][0.5], "p99_ms": p[variant][0.99],
                             "p999_ms": p[variant][0.999], "p99_added_ms": added,
                             "non_2xx": failed[name]}
        ours_added = p["ours"][0.99] - p["none"][0.99]
        lua_added = p["lua"][0.99] - p["none"][0.99]
        # a throttle whose added p99 is lost in the noise (≤ 0) cannot be a divisor: ours then
        # passes only if it adds no more than the noise either
        ratio = ours_added / lua_added if lua_added > 0 else \
            (0.0 if ours_added <= 0 else float("inf"))
        ratios[f"latency.p99_added_vs_bare_lua.{kind}"] = ratio
        ratios[f"latency.p999_ms.{kind}.ours"] = p["ours"][0.999]
        targets.append((f"3. latency {kind.upper()}: ours' added p99 ≤ {P99_ADDED_LIMIT}× the "
                        f"bare Lua throttle's (over no throttle, {rates[kind]} req/s)",
                        f"{ratio:.2f}× ({ours_added:+.2f} vs {lua_added:+.2f} ms)",
                        verdict(ratio <= P99_ADDED_LIMIT)))
    ratios["latency.p99_added_vs_bare_lua"] = max(
        ratios[f"latency.p99_added_vs_bare_lua.{kind}"] for kind in KINDS)
    markdown = table(["server", "variant", "rate (req/s)", "requests", "p50 ms", "p99 ms",
                      "p99.9 ms", "p99 added (ms)", "non-2xx"], rows)
    return {"title": f"3. Latency at a fixed rate (hey, {WORKERS} workers, {LOAD_SHARE:.0%} of "
                     f"the no-throttle server's capacity, {seconds} s × {rounds} rounds each)",
            "markdown": markdown, "results": results, "ratios": ratios, "targets": targets}
