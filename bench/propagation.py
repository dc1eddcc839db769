"""9. Config propagation: how soon after an admin edit each worker decides on the new rules,
whether a request made after the edit is ever decided on older ones, and what the watcher
thread that picks edits up costs an idle worker.

gunicorn (sync workers) serves the bench's view on a copy of the bench's SQLite database and a
redis-server of its own, with EXPOSE_CONFIG_VERSION: each response names the config version
that decided it (RateLimit-Config-Version) and the worker (RateLimit-Worker). An editor process
(``python -m bench.propagation --edit …``) saves a rule through ``Rule.save()`` a second after
its previous save returned, so the signal publishes a new version at the commit; the moment the
save returns (the version is then in Redis, read to check it) is the edit's publication.
Clients record each request's start, end, version and worker, idle (one client, about 2
requests/s) and under load (clients back to back). ``analyse`` turns those records into:

- delay: for each edit and worker, from the publication to the end of that worker's first
  response decided on the edit's version. Idle, that is mostly the wait for a request to reach
  the worker, so the idle target counts from the later of the publication and that request's
  start instead (``answer_ms``): what the worker itself took to decide on the new rules.
- stale: responses to requests started after a publication that carry an older version. The
  fence (take.lua refuses a debit made on superseded rules) should keep this at 0.

The watcher's CPU: the workers of two idle servers (no request during the measurement), the
watcher polling every CONFIG_WATCH_INTERVAL_S (the default) and every hour, measured over the
same seconds from /proc/<pid>/stat; the difference per worker per second of wall time.
"""

import argparse
import bisect
import http.client
import json
import math
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from . import servers
from .harness import ROOT, percentile, table, verdict

WORKERS = 2
EDIT_EVERY_S = 1.0
EDITED_RULE = "anon-item-ip"  # a rule every measured request is decided by
IDLE_GAP_S = (0.25, 0.75)     # between the idle client's requests: about 2 per second
LOAD_CLIENTS = 4
TAIL_S = 1.0                  # clients go on this long after the last edit
BASELINE_WATCH_INTERVAL_S = 3600.0
# targets: no stale decision; the p99 delay ≤ 100 ms plus the watch interval; the watcher's
# CPU ≤ 1 % of a core per worker
STALE_LIMIT = 0
DELAY_BASE_MS = 100.0
CPU_LIMIT_SHARE = 0.01


@dataclass(frozen=True)
class Response:
    """One request as a client saw it: monotonic seconds, HTTP status (0: no response), and
    what the response said decided it (None / 0 when it said nothing)."""

    started: float
    ended: float
    status: int
    version: str | None
    worker: int


@dataclass(frozen=True)
class Edit:
    """One saved edit: the monotonic second its save returned, the version it published, and
    how long the save took."""

    published_at: float
    version: str
    save_ms: float = 0.0


def analyse(responses, edits, workers, initial_version):
    """Return what ``responses`` say of the propagation of ``edits`` (in publication order) to
    ``workers`` (pids), the version before the first edit being ``initial_version``:

    - ``delays_ms``: per edit and worker that answered on the edit's version, publication → the
      end of its first such response; ``answer_ms`` the same from the later of the publication
      and that request's start;
    - ``unobserved``: edit×worker pairs with no response on the edit's version (no request
      reached the worker before the next edit, or it answered on another version);
    - ``stale_per_edit``: per edit, responses to requests started after its publication (and
      before the next one's) carrying an older version;
    - ``errors``: requests without a 200 response naming its version; ``unknown_versions``:
      responses naming a version neither ``initial_version`` nor an edit's.
    """
    order = {initial_version: -1, **{edit.version: index for index, edit in enumerate(edits)}}
    published = [edit.published_at for edit in edits]
    first = {}  # (edit index, worker) -> the first response on that version
    stale_per_edit = [0] * len(edits)
    errors = unknown = 0
    for response in sorted(responses, key=lambda r: r.ended):
        if response.status != 200 or response.version is None:
            errors += 1
            continue
        decided_on = order.get(response.version)
        if decided_on is None:
            unknown += 1
            continue
        latest = bisect.bisect_left(published, response.started) - 1  # last edit before start
        if latest >= 0 and decided_on < latest:
            stale_per_edit[latest] += 1
        if decided_on >= 0:
            first.setdefault((decided_on, response.worker), response)
    delays, answers, unobserved = [], [], 0
    for index, edit in enumerate(edits):
        for worker in workers:
            response = first.get((index, worker))
            if response is None:
                unobserved += 1
                continue
            # the version was in Redis a moment before the save returned: never below 0
            delays.append(max(response.ended - edit.published_at, 0.0) * 1000)
            answers.append(max(response.ended - max(edit.published_at, response.started),
                               0.0) * 1000)
    return {"delays_ms": delays, "answer_ms": answers, "unobserved": unobserved,
            "pairs": len(edits) * len(workers), "stale_per_edit": stale_per_edit,
            "errors": errors, "unknown_versions": unknown}


def summary(analysis):
    """Return p50, p99 and max of the delays and answers (ms), and the stale counts."""
    stale = analysis["stale_per_edit"]
    out = {"stale_total": sum(stale), "stale_max_per_edit": max(stale, default=0)}
    for name in ("delays_ms", "answer_ms"):
        values = analysis[name]
        stem = name.removesuffix("_ms")
        out.update({f"{stem}_p50_ms": percentile(values, 0.5),
                    f"{stem}_p99_ms": percentile(values, 0.99),
                    f"{stem}_max_ms": max(values, default=math.nan)})
    return out


# --- the servers, the clients and the editor --------------------------------------------------

class PropagationServer(servers.Gunicorn):
    """gunicorn on the section's database and Redis, naming the deciding version."""

    def __init__(self, sqlite_path, redis_url, watch_interval_s=None):
        super().__init__("ours", workers=WORKERS)
        self.extra_env = {"BENCH_SQLITE_PATH": sqlite_path, "REDIS_URL": redis_url,
                          "BENCH_EXPOSE_CONFIG_VERSION": "1"}
        if watch_interval_s is not None:
            self.extra_env["BENCH_CONFIG_WATCH_INTERVAL_S"] = str(watch_interval_s)


def fetch(port, path="/item/"):
    """GET ``path``; return a Response (status 0 if the request failed)."""
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        reply.read()
        worker = reply.getheader("RateLimit-Worker")
        return Response(started, time.monotonic(), reply.status,
                        reply.getheader("RateLimit-Config-Version"), int(worker or 0))
    except (OSError, http.client.HTTPException):
        return Response(started, time.monotonic(), 0, None, 0)
    finally:
        connection.close()


class Clients:
    """Client threads recording every response until ``stop()``: ``count`` threads back to
    back, or one (``idle``) waiting a random IDLE_GAP_S between requests."""

    def __init__(self, port, count=1, idle=False, seed=0):
        self.port, self.idle = port, idle
        self.responses = []  # list.append is atomic: the threads share it
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(random.Random(seed + i),),
                                          daemon=True) for i in range(count)]

    def _run(self, rng):
        while not self._stop.is_set():
            self.responses.append(fetch(self.port))
            if self.idle:
                self._stop.wait(rng.uniform(*IDLE_GAP_S))

    def start(self):
        for thread in self._threads:
            thread.start()
        return self

    def stop(self):
        self._stop.set()
        for thread in self._threads:
            thread.join(15)
        return self.responses


def warm(server, timeout_s=30):
    """Send requests until each worker has answered one (its rules compiled, its watcher
    running); return the worker pids."""
    pids = set(server.worker_pids())
    seen = set()
    deadline = time.monotonic() + timeout_s
    while not pids <= seen:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {sorted(pids - seen)} never answered")
        batch = [threading.Thread(target=lambda: seen.add(fetch(server.port).worker))
                 for _ in range(4)]
        for thread in batch:
            thread.start()
        for thread in batch:
            thread.join()
    return sorted(pids)


def run_editor(env, count):
    """Run the editor process (``count`` edits, EDIT_EVERY_S apart); return its Edits."""
    done = subprocess.run([sys.executable, "-m", "bench.propagation", "--edit", EDITED_RULE,
                           "--count", str(count), "--every-s", str(EDIT_EVERY_S)],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60 + count * EDIT_EVERY_S * 3)
    if done.returncode:
        raise RuntimeError(f"the editor failed:\n{done.stderr[-2000:]}")
    return [Edit(**json.loads(line)) for line in done.stdout.splitlines() if line.strip()]


def version_key():
    """The Redis key of the config version (this process's settings: the servers')."""
    from ratelimit_app.conf import get_config
    from ratelimit_app.decision.keys import config_version_key

    return config_version_key(get_config()["KEY_PREFIX"])


def phase(workers, editor_env, redis_client, edits, clients):
    """Run ``clients`` while the editor saves ``edits`` edits; return the analysis."""
    initial = (redis_client.get(version_key()) or b"0").decode()
    clients.start()
    try:
        saved = run_editor(editor_env, edits)
        time.sleep(TAIL_S)  # responses to the last edit
    finally:
        responses = clients.stop()
    analysis = analyse(responses, saved, workers, initial)
    latencies = [(r.ended - r.started) * 1000 for r in responses if r.status == 200]
    analysis.update(requests=len(responses), latency_p50_ms=percentile(latencies, 0.5),
                    latency_p99_ms=percentile(latencies, 0.99),
                    save_ms=[edit.save_ms for edit in saved])
    # a worker gunicorn replaced meanwhile answers under a pid of its own
    answered = {r.worker for r in responses if r.status == 200}
    analysis["other_workers"] = len(answered - set(workers))
    return analysis


def watcher_cpu(watching, baseline, seconds):
    """CPU ms per second of each idle server's workers (means per worker), measured over the
    same ``seconds``: {"watching_ms_per_s", "baseline_ms_per_s", "added_ms_per_s"}."""
    pids = {"watching": watching.worker_pids(), "baseline": baseline.worker_pids()}
    before = {pid: servers.cpu_seconds(pid) for group in pids.values() for pid in group}
    started = time.monotonic()
    time.sleep(seconds)  # the measurement: idle workers, nothing else to wait for
    elapsed = time.monotonic() - started
    used = {name: sum(servers.cpu_seconds(pid) - before[pid] for pid in group)
            / len(group) / elapsed * 1000 for name, group in pids.items()}
    return {"watching_ms_per_s": used["watching"], "baseline_ms_per_s": used["baseline"],
            "added_ms_per_s": used["watching"] - used["baseline"], "seconds": elapsed}


def _copy_database(target):
    """Copy the bench's SQLite database (its fixture rows) to ``target``."""
    with sqlite3.connect(os.environ["BENCH_SQLITE_PATH"]) as source, \
            sqlite3.connect(target) as copy:
        source.backup(copy)


def run(env, quick):
    from ratelimit_app.conf import DEFAULTS
    from ratelimit_app.testing import RedisServer

    edits = {"idle": 5, "load": 5} if quick else {"idle": 20, "load": 10}
    load_average = [os.getloadavg()[0]]
    cpu_seconds = 3 if quick else 5
    watch_interval_s = DEFAULTS["CONFIG_WATCH_INTERVAL_S"]
    workdir = tempfile.mkdtemp(prefix="bench-propagation-")
    sqlite_path = os.path.join(workdir, "propagation.sqlite3")
    _copy_database(sqlite_path)
    redis_server = RedisServer().start()
    running = {}
    try:
        editor_env = {**os.environ, "BENCH_SQLITE_PATH": sqlite_path,
                      "REDIS_URL": redis_server.url, "DJANGO_SETTINGS_MODULE": "bench.settings"}
        running["watching"] = PropagationServer(sqlite_path, redis_server.url).start()
        running["baseline"] = PropagationServer(sqlite_path, redis_server.url,
                                                BASELINE_WATCH_INTERVAL_S).start()
        workers = warm(running["watching"])
        warm(running["baseline"])
        time.sleep(1.0)  # the warm-up's after-effects (a metrics flush) out of the measurement
        cpu = watcher_cpu(running["watching"], running["baseline"], cpu_seconds)
        running.pop("baseline").stop()
        port = running["watching"].port
        with redis_server.client() as client:
            phases = {"idle": phase(workers, editor_env, client, edits["idle"],
                                    Clients(port, idle=True)),
                      "load": phase(workers, editor_env, client, edits["load"],
                                    Clients(port, count=LOAD_CLIENTS))}
    finally:
        servers.stop_all(running)
        redis_server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    load_average.append(os.getloadavg()[0])
    return report(phases, cpu, watch_interval_s, edits, load_average)


def report(phases, cpu, watch_interval_s, edits, load_average=None):
    """The section's result: table, targets, and the figures for the JSON. ``load_average``:
    the machine's 1-minute load average before and after (other work on it shows there)."""
    delay_limit_ms = DELAY_BASE_MS + watch_interval_s * 1000
    results = {name: {**summary(analysis), **analysis} for name, analysis in phases.items()}
    labels = {"idle": "idle (1 client, ~2 requests/s)",
              "load": f"under load ({LOAD_CLIENTS} clients back to back)"}
    rows = []
    for name, result in results.items():
        rows.append([labels[name], result["requests"], edits[name],
                     f"{result['pairs'] - result['unobserved']}/{result['pairs']}",
                     f"{result['delays_p50_ms']:.1f} / {result['delays_p99_ms']:.1f} / "
                     f"{result['delays_max_ms']:.1f}",
                     f"{result['answer_p50_ms']:.1f} / {result['answer_p99_ms']:.1f} / "
                     f"{result['answer_max_ms']:.1f}",
                     result["stale_total"], result["stale_max_per_edit"],
                     result["errors"] + result["unknown_versions"],
                     f"{result['latency_p50_ms']:.1f} / {result['latency_p99_ms']:.1f}",
                     f"{percentile(result['save_ms'], 0.5):.0f} / "
                     f"{max(result['save_ms'], default=math.nan):.0f}"])
    markdown = table(["traffic", "requests", "edits", "edit×worker pairs observed",
                      "publication → first decision on it, ms (p50 / p99 / max)",
                      "the same from the first request after the publication",
                      "stale decisions", "max stale per edit", "errors",
                      "request latency, ms (p50 / p99)", "editor's save, ms (p50 / max)"], rows)
    cpu_share = cpu["added_ms_per_s"] / 1000
    markdown += (f"\n\nWatcher CPU per idle worker ({cpu['seconds']:.1f} s, /proc/<pid>/stat): "
                 f"{cpu['watching_ms_per_s']:.2f} ms/s polling every {watch_interval_s} s, "
                 f"{cpu['baseline_ms_per_s']:.2f} ms/s every {BASELINE_WATCH_INTERVAL_S:.0f} s: "
                 f"{cpu['added_ms_per_s']:+.2f} ms CPU per s ({cpu_share:.2%} of a core).")
    if load_average:
        markdown += (f"\n\nMachine load average (1 min) {load_average[0]:.1f} before, "
                     f"{load_average[-1]:.1f} after, on {os.cpu_count()} CPUs.")
    markdown += ("\n\nIdle, a worker's first response on an edit waits for a request to reach "
                 "it (about 2 a second for all workers), so the idle target counts from that "
                 "request's start (or the publication, if later).")
    stale = sum(r["stale_total"] for r in results.values())
    stale_max = max(r["stale_max_per_edit"] for r in results.values())
    idle_p99, load_p99 = results["idle"]["answer_p99_ms"], results["load"]["delays_p99_ms"]
    targets = [
        (f"6. propagation: stale decisions per edit = {STALE_LIMIT} (idle and under load)",
         f"{stale} in all, at most {stale_max} per edit", verdict(stale_max <= STALE_LIMIT)),
        (f"6. propagation idle: p99 from a worker's first request after an edit to its "
         f"decision on it ≤ {delay_limit_ms:.0f} ms", f"{idle_p99:.1f} ms",
         verdict(idle_p99 <= delay_limit_ms)),
        (f"6. propagation under load: p99 publication → a worker's first decision on the edit "
         f"≤ {delay_limit_ms:.0f} ms", f"{load_p99:.1f} ms", verdict(load_p99 <= delay_limit_ms)),
        (f"6. config watcher: ≤ {CPU_LIMIT_SHARE:.0%} of a core per idle worker",
         f"{cpu_share:.2%} ({cpu['added_ms_per_s']:+.2f} ms/s)",
         verdict(cpu_share <= CPU_LIMIT_SHARE)),
    ]
    results["watcher_cpu"] = {**cpu, "share_of_core": cpu_share,
                              "watch_interval_s": watch_interval_s,
                              "baseline_watch_interval_s": BASELINE_WATCH_INTERVAL_S}
    results["targets_ms"] = {"delay_p99": delay_limit_ms}
    results["load_average"] = load_average
    results["verdicts"] = {"stale": targets[0][2], "idle_p99": targets[1][2],
                           "load_p99": targets[2][2], "watcher_cpu": targets[3][2]}
    return {"title": f"9. Config propagation (gunicorn {WORKERS} sync workers, an edit "
                     f"{EDIT_EVERY_S:.0f} s after the last)", "markdown": markdown,
            "results": results, "targets": targets}


# --- the editor process -----------------------------------------------------------------------

def edit(rule_name, count, every_s, warm_up=False):
    """Save rule ``rule_name`` ``count`` times (its rate toggled by one, so every request stays
    allowed), each save starting ``every_s`` after the previous one returned; print one JSON
    line per edit: its publication (the monotonic second the save returned), the version it
    published and how long the save took.

    Timed from the previous publication, not on a fixed clock: a save takes some ms, more on a
    busy machine (and a process's first, its audit entry a whole export, a few hundred), and a save
    overlapping the workers' compile of the previous edit holds that compile up (its CPU, and
    SQLite's write lock keeping the compile's reads waiting: up to ~1.5 s under load), which
    would be measured as the previous edit's delay.

    ``warm_up``: first save once, unreported, and print ``{"ready": true}``: the process's
    start (Django's imports) and its first save (the audit trail's first entry in a process
    exports the configuration whole) then come before whatever the caller measures."""
    import django

    django.setup()
    import redis

    from ratelimit_app.models import Rule

    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    key = version_key()
    rule = Rule.objects.get(name=rule_name)

    def save():
        rule.rate = rule.rate - 1 if rule.rate % 2 == 0 else rule.rate + 1
        rule.save()

    if warm_up:
        save()
        print(json.dumps({"ready": True}), flush=True)
    previous = client.get(key)
    next_at = time.monotonic() + every_s
    for _ in range(count):
        time.sleep(max(next_at - time.monotonic(), 0))  # the edit's moment
        saving = time.monotonic()
        save()
        published_at = time.monotonic()
        version = client.get(key)
        if version is None or version == previous:
            raise RuntimeError(f"the save of {rule_name} published no new version")
        previous, next_at = version, published_at + every_s
        print(json.dumps({"published_at": published_at, "version": version.decode(),
                          "save_ms": (published_at - saving) * 1000}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the config propagation section's editor")
    parser.add_argument("--edit", required=True, help="the name of the rule to save")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--every-s", type=float, default=EDIT_EVERY_S)
    parser.add_argument("--warm-up", action="store_true",
                        help="save once first, unreported, then print a ready line")
    options = parser.parse_args()
    edit(options.edit, options.count, options.every_s, options.warm_up)
