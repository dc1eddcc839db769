"""``make bench``: every comparison in one run, printed as markdown and saved as JSON.

    .venv/bin/python bench/run.py [--quick] [--only decision,redis_cpu,...]

Starts its own redis-server (127.0.0.1, free port) and SQLite database in a temp dir, runs the
sections below, and stops everything it started by PID, also on errors or Ctrl-C. A section
that raises is reported as failed (printed, and in the JSON as ``"status": "failed"`` with its
error) while the others still run; the exit status is then 1.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

# Import bench.* as a package from the repository root (and never bench/ itself as the top
# level, where module names could shadow the standard library's); imported (by tests), the
# importer's path stays as it is.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import Environment, table  # noqa: E402

SECTIONS = ["decision", "redis_cpu", "bans", "http", "latency",
            "overgrant", "flood", "memory", "scale", "cluster",
            "propagation"]
MODULES = {"http": "http_throughput"}  # section name -> module in bench/
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine():
    with open("/proc/cpuinfo") as cpuinfo:
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo
                    if line.startswith("model name")), platform.processor())
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True,
                                   text=True).stdout.split()[2].removeprefix("v=")
    import django
    import redis
    return {"cpu": cpu, "vcpus": os.cpu_count(), "python": platform.python_version(),
            "django": django.get_version(), "redis_py": redis.__version__,
            "redis_server": redis_version, "platform": platform.platform()}


def load_section(name):
    """Return section ``name``'s ``run(env, quick)`` (bench/<module>.py)."""
    import importlib

    return importlib.import_module(f"bench.{MODULES.get(name, name)}").run


def run_section(name, run, env, quick):
    """Run one section; return its result, or {"status": "failed", "error": …} if it raised.

    One section's failure (a bug, a slow host) must not cost the others' figures: a full run
    takes many minutes, and the JSON is written only at its end."""
    started = time.monotonic()
    try:
        env.reset_redis()
        result = run(env, quick)
    except Exception as error:
        result = {"status": "failed", "error": f"{type(error).__name__}: {error}",
                  "traceback": traceback.format_exc()}
        print(f"## {name}: FAILED\n\n{result['error']}\n", flush=True)
        print(result["traceback"], file=sys.stderr, flush=True)
    else:
        result["status"] = "ok"
        print(f"## {result['title']}\n\n{result['markdown']}\n", flush=True)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def main(argv=None, sections=None, environment=Environment, results_dir=None):
    """Run the chosen sections; write the JSON; return the exit status (1 if a section failed).

    ``sections`` (name -> ``run(env, quick)``), ``environment`` and ``results_dir`` replace the
    real ones in tests."""
    names = list(sections or SECTIONS)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    parser.add_argument("--only", default=",".join(names),
                        help="comma-separated sections: " + ", ".join(names))
    options = parser.parse_args(argv)
    chosen = [s.strip() for s in options.only.split(",") if s.strip()]
    unknown = set(chosen) - set(names)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")

    started = time.monotonic()
    env = environment()
    report = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "quick": options.quick, "sections": {}}
    try:
        env.start()
        report["machine"] = machine()
        print(f"# Benchmark ({'quick' if options.quick else 'full'} run)\n")
        print("Machine: " + ", ".join(f"{k} {v}" for k, v in report["machine"].items()) + "\n",
              flush=True)
        for name in names:
            if name in chosen:
                run = sections[name] if sections else load_section(name)
                report["sections"][name] = run_section(name, run, env, options.quick)
    finally:
        env.stop()
    # the issue's numbering (1. decision … 5. nothing else moves), whatever the sections' order
    targets = sorted((row for s in report["sections"].values() for row in s.get("targets", [])),
                     key=lambda row: int(row[0].split(".")[0]))
    if targets:
        print("## Targets\n\n" + table(["target", "measured", "verdict"], targets) + "\n")
    failed = {name: s["error"] for name, s in report["sections"].items()
              if s["status"] == "failed"}
    report["failed"] = sorted(failed)
    if failed:
        print("## Failed sections (no figures, no targets)\n\n"
              + table(["section", "error"], sorted(failed.items())) + "\n")
    report["seconds"] = round(time.monotonic() - started, 1)
    results_dir = Path(results_dir or RESULTS_DIR)
    results_dir.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = results_dir / f"bench-{stamp}{'-quick' if options.quick else ''}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"Total {report['seconds']} s. JSON: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
