"""Micro-benchmark: what ``Recorder.record`` costs per decision, counting included (one request
in COUNT_BATCH counts the queued batch, so the figure is the amortised cost a request pays).

    .venv/bin/python bench/recorder_cost.py            # µs per decision, best of 7 runs

The decisions look like the demo's: a signed-in caller with a tenant, three policies (global,
plan, user), one in eight refused, 50 distinct callers. Not a section of ``make bench``.
"""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from ratelimit_app.decision.buckets import PolicyStatus  # noqa: E402
from ratelimit_app.decision.engine import Decision  # noqa: E402
from ratelimit_app.decision.identity import Identity  # noqa: E402
from ratelimit_app.metrics import Recorder  # noqa: E402

DECISIONS = 100_000
RUNS = 7


def decisions():
    """Return DECISIONS decisions cycling over 50 callers."""
    callers = [Identity("user", f"user{i}", "10.0.0.1", "pro", tenant=f"t{i % 5}",
                        user_id=str(i)) for i in range(50)]
    made = []
    for i in range(DECISIONS):
        allowed = i % 8 != 0
        statuses = tuple(
            PolicyStatus(name, 100, 60, 100, 50 + i % 40, 1, 10, 1, False, not allowed and
                         name == "pro-user", f"rl:{{user.{i % 50}}}", 50_000, scope)
            for name, scope in (("global", "global"), ("pro-plan", "plan"),
                                ("pro-user", "user")))
        made.append(Decision(allowed, 0 if allowed else 1, statuses,
                             () if allowed else ("pro-user",), (), callers[i % 50],
                             "api:items", 1))
    return made


def main():
    made = decisions()
    figures = []
    for _ in range(RUNS):
        recorder = Recorder()
        record = recorder.record
        started = time.perf_counter()
        for decision in made:
            record(decision)
        recorder.take_pending()  # the last partial batch: what the flush thread would count
        figures.append((time.perf_counter() - started) / DECISIONS * 1e6)
    print(f"Recorder.record, counting included: {min(figures):.2f} µs per decision "
          f"(median {statistics.median(figures):.2f})")


if __name__ == "__main__":
    main()
