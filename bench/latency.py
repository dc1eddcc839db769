"""3. Latency at a fixed request rate: p50 / p99 / p99.9 of the response time of each variant,
WSGI (gunicorn, 2 sync workers, the DRF view) and ASGI (uvicorn, 2 workers, the async def view),
at the same rate for every variant of a server kind: 40 % of what the slowest of them serves
flat out, read with wrk again before every round, so that every variant runs below saturation.
Half of the no-throttle server's capacity, the rate used first, loads a throttled gunicorn to
80-90 % of its own: its p99 then comes from queues that build in a noisy second and take the
next second to drain (both throttles showed 0.3-1 s episodes of 30-50 ms waits), and a few per
cent of capacity between two variants decides how many such episodes each gets. Half of the
slowest variant's capacity read once at the section's start, the rate used next, did the same
on a host whose speed swings: the readings went from 1,355 to 2,064 requests a second within
twenty minutes, and a rate set in a fast minute ran the throttled servers at their limit in a
slow one (both WSGI rows of two full runs: the bare Lua throttle's p99 +78 ms). Each round now
has its own rate, and at 40 % a host that slows to half its speed within a round still runs
the servers at 80 %.

The load comes from bench/fixed_rate.py, an open-loop client: evenly spaced requests whatever
the server does, each response timed. Debian packages no open-loop generator that spaces its
requests evenly (wrk2 is not packaged). hey's ``-q`` workers, used here before, all tick
together: its 64 workers sent 64 requests at once every 1/(rate/64) seconds, so the section
measured how long a burst of 64 took to drain (a p50 of 17 ms at 5 % of the no-throttle
server's capacity, against 1.7 ms with the same requests spread out), and a throttled server,
slower to drain, fell behind the rate. ``h2load --rps`` paces its clients the same way and does
not reopen the connections gunicorn's sync workers close.

The figure that matters is the p99 a throttle adds over the no-throttle server of the same kind
(each variant's requests of all rounds pooled); ours is compared with the bare 4-key Lua
throttle's. The rounds are short (3 s) and many, the variants taking turns: a stall of the host, a
few hundred ms in which every request waits, is then as likely in any variant's run, where with 8 s
runs one stall in one run decided the target alone (60 slow requests are the whole 1 % of an ASGI
row). A p99 added by each round on its own, the median of the rounds, was tried too: the
no-throttle run's own p99 moved by ±5 ms from round to round, more than either throttle adds. One
more WSGI row, with a target of its own: ours' server again while another process saves a rule
every second, as an operator in the admin does; each worker then reads that rule again (see
docs/howto/apply-edits.md, "What an edit costs"). Its added p99 is held to the same bound over the
bare Lua throttle's (without edits: the bare throttle has no configuration to edit).
"""

import contextlib
import json
import select
import subprocess
import sys

from . import servers
from .fixed_rate import run_fixed_rate
from .harness import ROOT, percentile, table, verdict

LOAD_SHARE = 0.4  # of the capacity of the slowest variant of the server kind, read each round
KINDS = {  # kind -> (server names by variant, path, label)
    "wsgi": ({"none": "none", "lua": "lua", "ours": "ours"}, "/item/",
             "WSGI (gunicorn 2 sync workers), DRF view"),
    "asgi": ({"none": "none-asgi", "lua": "lua-asgi", "ours": "ours-asgi"}, "/aitem/",
             "ASGI (uvicorn 2 workers), async def view"),
}
VARIANT_LABELS = {"none": "no throttle", "lua": "bare 4-key Lua throttle", "ours": "ours",
                  "ours-edits": "ours, a config edit every second"}
# the row of ours under edits: its server, and the seconds between two new config versions
EDITS_RUN, EDITS_SERVER, EDIT_EVERY_S = "ours-edits", "ours", 1.0
EDITED_RULE = "noise-0"  # a rule of another plan: every measured request stays allowed
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


@contextlib.contextmanager
def config_edits(every_s, ready_timeout_s=120):
    """Save a rule about every ``every_s`` seconds while the block runs, as an operator's save
    in the admin does (a noise rule, its rate toggled by one: the version each commit publishes
    names that row, and each worker reads it alone); yield a list that ends up holding each
    save's line (``published_at``, ``version``, ``save_ms``).

    The saves run in an editor process of their own (bench/propagation.py's): in this process,
    a save would hold the GIL from the load generator's threads and be measured as the servers'
    latency. It stands for an operator's admin, on another machine as often as not: it runs
    under Linux's idle scheduling class (``chrt --idle``: it gets a core only when no server
    process wants one), so that what the row measures is what an edit costs the servers
    (noticing it, compiling it, deciding again the requests the fence refused), not the share
    of the bench's 2 cores a save takes (about 10 ms of CPU; the median wall time of a save is
    in the JSON, ``save_ms_p50``). At nice 19, as before, the requests that came during a save
    were still slow several times as often as the others (A/B runs in
    docs/explanation/performance.md). The block starts once the editor is ready: its start
    (Django's imports, about a second of CPU) and its first save (the audit trail's first
    entry in a process is a whole export) are not an edit's cost either."""
    editor = subprocess.Popen(
        ["chrt", "--idle", "0", sys.executable, "-m", "bench.propagation", "--edit", EDITED_RULE,
         "--warm-up", "--count", "1000000", "--every-s", str(every_s)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    saves, ready = [], False
    try:
        if select.select([editor.stdout], [], [], ready_timeout_s)[0]:
            ready = json.loads(editor.stdout.readline() or "{}") == {"ready": True}
        if ready:
            yield saves
    finally:
        editor.terminate()
        output, errors = editor.communicate(timeout=30)
        saves += [json.loads(line) for line in output.splitlines() if line.strip()]
    if not ready:
        raise RuntimeError(f"the editor did not get ready:\n{errors[-2000:]}")
    if not saves:  # a row "with edits" measured without any would pass for what it is not
        raise RuntimeError(f"the editor saved nothing:\n{errors[-2000:]}")


def measure_rates(running):
    """Read each server's capacity now (wrk, 2 s, 32 connections); return ``({kind: rate},
    {server: reading})``, a kind's rate being LOAD_SHARE of its slowest variant's reading."""
    rates, readings = {}, {}
    for kind, (names, path, _) in KINDS.items():
        measured = {name: servers.wrk(running[name].url(path), 2) for name in names.values()}
        readings.update({name: {"rps": wrk["rps"], "non_2xx": wrk["non_2xx"],
                                "socket_errors": wrk["socket_errors"]}
                         for name, wrk in measured.items()})
        rates[kind] = round(min(wrk["rps"] for wrk in measured.values()) * LOAD_SHARE)
    return rates, readings


def rate_text(rates):
    """The rates of a kind's rounds, as the table shows them: one number, or the range."""
    low, high = min(rates), max(rates)
    return str(low) if low == high else f"{low}–{high}"


def settle_after_edits(running, rates, seconds=2):
    """Have every worker of ours' servers (WSGI and ASGI) on the last edit's rules before the
    next measured run: unmeasured requests at the round's rates, decided (and, if fenced,
    decided again) once each worker's watcher has installed the edit."""
    for kind, (names, path, _) in KINDS.items():
        run_fixed_rate("127.0.0.1", running[names["ours"]].port, path, rates[kind], seconds)


def run(env, quick):
    rounds, seconds = (1, 4) if quick else (12, 3)
    running = start_servers()
    runs = [*running, EDITS_RUN]
    times = {name: [] for name in runs}
    failed = {name: 0 for name in runs}
    late = {name: [] for name in runs}  # how far after its slot each request went out
    saves = []  # each edit's line from the editor
    rates = {kind: [] for kind in KINDS}  # each round's, per kind
    capacities = []  # each round's wrk readings (in the JSON: the rates come from them)
    try:
        for kind, (names, path, _) in KINDS.items():
            for name in names.values():
                servers.wrk(running[name].url(path), 1)  # warm up both workers
        order = [(kind, name) for kind, (names, _, _) in KINDS.items() for name in names.values()]
        order.append(("wsgi", EDITS_RUN))
        for round_number in range(rounds):
            round_rates, readings = measure_rates(running)
            capacities.append(readings)
            for kind, rate in round_rates.items():
                rates[kind].append(rate)
            shift = round_number % len(order)
            for kind, name in order[shift:] + order[:shift]:
                server = running[EDITS_SERVER if name == EDITS_RUN else name]
                with config_edits(EDIT_EVERY_S) if name == EDITS_RUN else \
                        contextlib.nullcontext([]) as written:
                    result = run_fixed_rate("127.0.0.1", server.port, KINDS[kind][1],
                                            round_rates[kind], seconds)
                saves += written
                if name == EDITS_RUN:
                    settle_after_edits(running, round_rates)
                times[name].append(result.times_ms)
                failed[name] += result.failed
                late[name] += result.late_ms
        # no FLUSHALL between rounds (one client, so no bucket or key grows): it would also wipe
        # the config version, and ours would then reload its rules (about 40 ms per worker
        # with the bench's rows) inside a measured round
    finally:
        servers.stop_all(running)

    rows, results, ratios, targets = [], {}, {}, []
    for kind, (names, _, label) in KINDS.items():
        variants = dict(names, **({"ours-edits": EDITS_RUN} if kind == "wsgi" else {}))
        every_time = {variant: pooled(times[name]) for variant, name in variants.items()}
        p = {variant: {share: percentile(every_time[variant], share)
                       for share in (0.5, 0.99, 0.999)}
             for variant in variants}
        added = {variant: p[variant][0.99] - p["none"][0.99] for variant in variants}
        for variant, name in variants.items():
            label_text = VARIANT_LABELS[variant]
            if name == EDITS_RUN:
                label_text += f" ({len(saves)} edits)"
            rows.append([label, label_text, rate_text(rates[kind]), len(every_time[variant]),
                         *p[variant].values(), f"{added[variant]:+.2f}",
                         failed[name], percentile(late[name], 0.99)])
            results[name] = {"rates_rps": rates[kind], "requests": len(every_time[variant]),
                             "p50_ms": p[variant][0.5], "p99_ms": p[variant][0.99],
                             "p999_ms": p[variant][0.999], "p99_added_ms": added[variant],
                             "non_2xx": failed[name],
                             "send_late_p99_ms": percentile(late[name], 0.99)}
            ratios[f"latency.p999_ms.{kind}.{variant}"] = p[variant][0.999]
        lua_added = added["lua"]
        compared = []  # (variant, target's text, its ratio's key), in the targets' order
        if kind == "wsgi":
            compared.append(("ours-edits", "3. latency WSGI, a rule saved every second: ours' "
                                           f"added p99 ≤ {P99_ADDED_LIMIT}× the bare Lua "
                                           "throttle's (without edits)", "wsgi_with_edits"))
            results[EDITS_RUN].update(
                config_edits=len(saves),
                # the editor's save, publication included (its wall time, in the idle class)
                save_ms_p50=percentile([save["save_ms"] for save in saves], 0.5))
            ratios["latency.wsgi.ours_with_edits.p99_added_ms"] = added["ours-edits"]
        compared.append(("ours", f"3. latency {kind.upper()}: ours' added p99 ≤ "
                                 f"{P99_ADDED_LIMIT}× the bare Lua throttle's (over no throttle, "
                                 f"{rate_text(rates[kind])} req/s)", kind))
        for variant, text, key in compared:
            ours_added = added[variant]
            ratio = ratios[f"latency.p99_added_vs_bare_lua.{key}"] = added_ratio(ours_added,
                                                                                 lua_added)
            targets.append((text, f"{ratio:.2f}× ({ours_added:+.2f} vs {lua_added:+.2f} ms)",
                            verdict(ratio <= P99_ADDED_LIMIT)))
    ratios["latency.p99_added_vs_bare_lua"] = max(
        ratios[f"latency.p99_added_vs_bare_lua.{kind}"] for kind in KINDS)
    results["capacity"] = capacities  # each round's wrk readings, the rates' source
    markdown = table(["server", "variant", "rate (req/s)", "requests", "p50 ms", "p99 ms",
                      "p99.9 ms", "p99 added (ms)", "non-2xx", "sent late, p99 ms"], rows)
    return {"title": f"3. Latency at a fixed rate (open loop, evenly spaced, {LOAD_SHARE:.0%} of "
                     f"the slowest variant's capacity read before each round, {seconds} s × "
                     f"{rounds} rounds each)",
            "markdown": markdown, "results": results, "ratios": ratios, "targets": targets}


def pooled(rounds):
    """Every round's response times in one list."""
    return [ms for times in rounds for ms in times]


def added_ratio(ours_added, lua_added):
    """ours' added p99 ÷ the bare Lua throttle's. A throttle whose added p99 is lost in the
    noise (≤ 0) cannot be a divisor: ours then passes only if it adds no more than the noise
    either."""
    if lua_added > 0:
        return ours_added / lua_added
    return 0.0 if ours_added <= 0 else float("inf")
