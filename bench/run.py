"""``make bench``: every comparison in one run, printed as markdown and saved as JSON.

    .venv/bin/python bench/run.py [--quick] [--only decision,redis_cpu,...]

Starts its own redis-server (127.0.0.1, free port) and SQLite database in a temp dir, runs the
sections below, and stops everything it started by PID, also on errors or Ctrl-C.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

# Import bench.* as a package from the repository root (and never bench/ itself as the top
# level, where module names could shadow the standard library's).
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import Environment, table  # noqa: E402

SECTIONS = ["decision", "redis_cpu", "http", "latency", "overgrant", "flood", "memory", "scale", "cluster"]
MODULES = {"http": "http_throughput"}  # section name -> module in bench/
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine():
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True,
                                   text=True).stdout.split()[2].removeprefix("v=")
    import django
    import redis
    return {"cpu": cpu, "vcpus": os.cpu_count(), "python": platform.python_version(),
            "django": django.get_version(), "redis_py": redis.__version__,
            "redis_server": redis_version, "platform": platform.platform()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter runs")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help="comma-separated sections: " + ", ".join(SECTIONS))
    options = parser.parse_args(argv)
    chosen = [s.strip() for s in options.only.split(",") if s.strip()]
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")

    started = time.monotonic()
    env = Environment()
    report = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "quick": options.quick, "sections": {}}
    try:
        env.start()
        report["machine"] = machine()
        print(f"# Benchmark ({'quick' if options.quick else 'full'} run)\n")
        print("Machine: " + ", ".join(f"{k} {v}" for k, v in report["machine"].items()) + "\n",
              flush=True)
        import importlib
        for name in SECTIONS:
            if name not in chosen:
                continue
            module = importlib.import_module(f"bench.{MODULES.get(name, name)}")
            env.reset_redis()
            section_started = time.monotonic()
            result = module.run(env, options.quick)
            result["seconds"] = round(time.monotonic() - section_started, 1)
            report["sections"][name] = result
            print(f"## {result['title']}\n\n{result['markdown']}\n", flush=True)
    finally:
        env.stop()
    # the issue's numbering (1. decision … 5. nothing else moves), whatever the sections' order
    targets = sorted((row for s in report["sections"].values() for row in s.get("targets", [])),
                     key=lambda row: int(row[0].split(".")[0]))
    if targets:
        print("## Targets\n\n" + table(["target", "measured", "verdict"], targets) + "\n")
    report["seconds"] = round(time.monotonic() - started, 1)
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = RESULTS_DIR / f"bench-{stamp}{'-quick' if options.quick else ''}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"Total {report['seconds']} s. JSON: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


if __name__ == "__main__":
    main()
