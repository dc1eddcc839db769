"""5. Flood: one client hammering ``/flood/`` (ip rule burst 10, 10 per second) while denied, through
gunicorn + wrk. Redis commands per denied request (INFO commandstats deltas, all commands) and
denied req/s against the same view without any throttle, runs interleaved."""

from . import servers
from .harness import median, table, verdict

TARGET_COMMANDS = 0.1
# The decision path: the script and what it runs inside Redis. The config version's GETs are
# each worker's watcher thread's (20 a second per worker, whatever the traffic: they used to
# be the request path's, once a second when a worker made no call), reported apart like the
# metrics flush (once a second per worker).
DECISION_COMMANDS = {"evalsha", "time", "mget", "set"}
WATCHER_COMMANDS = {"get"}


def _commands(client):
    """Return {command: calls} from INFO commandstats (without our own INFO/CONFIG calls)."""
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()
            if not k.startswith(("cmdstat_info", "cmdstat_config"))}


def _delta(after, before):
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def run(env, quick):
    rounds, seconds = (1, 5) if quick else (2, 10)
    client = env.client()
    running = servers.start_all(["none", "ours"])
    baseline, flood = [], []
    try:
        for server in running.values():
            servers.wrk(server.url("/flood/"), 1)
        for _ in range(rounds):
            baseline.append(servers.wrk(running["none"].url("/flood/"), seconds))
            before = _commands(client)
            result = servers.wrk(running["ours"].url("/flood/"), seconds)
            result["by_command"] = _delta(_commands(client), before)
            result["redis_commands"] = sum(result["by_command"].values())
            flood.append(result)
    finally:
        servers.stop_all(running)
    denied = sum(r["non_2xx"] for r in flood)
    allowed = sum(r["requests"] - r["non_2xx"] for r in flood)
    commands = sum(r["redis_commands"] for r in flood)
    decision_commands = sum(n for r in flood for k, n in r["by_command"].items()
                            if k in DECISION_COMMANDS)
    watcher_commands = sum(n for r in flood for k, n in r["by_command"].items()
                           if k in WATCHER_COMMANDS)
    per_denied = decision_commands / denied if denied else float("nan")
    watcher_per_denied = watcher_commands / denied if denied else float("nan")
    all_per_denied = commands / denied if denied else float("nan")
    denied_rps = median([r["non_2xx"] / r["seconds"] for r in flood])
    base_rps = median([r["rps"] for r in baseline])
    most_allowed = rounds * (10 + 10 * (seconds + 1))  # burst + refill (+1 s of warm-up slack)
    rows = [["no throttle", base_rps, "", "", ""],
            ["ours, flooded (all but the refill denied)", denied_rps, allowed,
             f"{decision_commands} ({watcher_commands}; {commands})",
             f"{per_denied:.4f} ({watcher_per_denied:.4f}; {all_per_denied:.4f})"]]
    markdown = table(["variant", "req/s (denied req/s when flooded)", "allowed",
                      "Redis commands: decisions (the watchers' version reads; all, incl. "
                      "metrics flush)",
                      "per denied request: decisions (watchers; all)"], rows)
    markdown += (f"\n\nDenied req/s ÷ no-throttle req/s: {denied_rps / base_rps:.2f}. "
                 f"Allowed {allowed} (the rule permits at most about {most_allowed}). "
                 f"Commands by name: {flood[-1]['by_command']}.")
    targets = [("5. flood: ≤ 0.1 Redis commands per denied request", f"{per_denied:.4f}",
                verdict(per_denied <= TARGET_COMMANDS and allowed <= most_allowed))]
    return {"title": f"5. Flood (one client, {seconds} s × {rounds}, 2 workers, deny cache on)",
            "markdown": markdown,
            "results": {"baseline": baseline, "flood": flood, "per_denied": per_denied,
                        "watcher_per_denied": watcher_per_denied,
                        "denied_rps": denied_rps, "all_per_denied": all_per_denied, "baseline_rps": base_rps},
            "targets": targets, "ratios": {"flood.commands_per_denied": per_denied}}
