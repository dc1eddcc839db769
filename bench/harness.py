"""What every benchmark section shares: the environment (own Redis, SQLite in a temp dir,
Django), interleaved timing, medians, ratios and markdown tables."""

import gc
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Environment:
    """A private redis-server and a migrated SQLite database loaded with bench/fixtures.py.

    Sets the environment variables the gunicorn servers and worker processes inherit.
    """

    def __init__(self):
        self.tmpdir = tempfile.mkdtemp(prefix="ratelimit-bench-")
        self.redis = None
        self.users = {}

    def start(self):
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from ratelimit_app.testing import RedisServer

        self.redis = RedisServer().start()
        self.redis.assert_empty()
        os.environ.update(
            REDIS_URL=self.redis.url,
            BENCH_SQLITE_PATH=os.path.join(self.tmpdir, "bench.sqlite3"),
            DJANGO_SETTINGS_MODULE="bench.settings",
            BENCH_VARIANT="ours",
        )
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        from bench import fixtures

        self.users = fixtures.load()
        return self

    def stop(self):
        if self.redis is not None:
            self.redis.stop()
            shutil.rmtree(self.redis.workdir, ignore_errors=True)
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    def client(self):
        return self.redis.client()

    def reset_redis(self):
        """Empty Redis and forget every process-local limiter state."""
        from ratelimit_app.runtime.limiter import install_limiter

        self.client().flushall()
        install_limiter()  # a new Limiter: no snapshot, deny cache or breaker state


def interleave(variants, rounds, batch, warmup=200, clock=time.perf_counter_ns):
    """Time each callable in ``variants`` (name -> fn) in ``rounds`` rounds of ``batch`` calls,
    the variants taking turns (A B C A B C …, the order rotated each round) so drift and noise
    hit them alike. Returns name -> list of per-call µs, one per round. ``clock`` (ns): the wall
    clock, or ``time.process_time_ns`` for this process's CPU alone (a Redis call's wait then
    counts for nothing)."""
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    samples = {name: [] for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            fn = variants[name]
            gc.collect()
            started = clock()
            for _ in range(batch):
                fn()
            samples[name].append((clock() - started) / batch / 1000)
    return samples


def median(values):
    return statistics.median(values) if values else float("nan")


def median_interval(values, share=0.9, resamples=2000):
    """Return ``(low, high)``: a bootstrap ``share`` interval of the median of ``values`` (per
    round figures), to show how far a median could move with other rounds of the same run. The
    resampling is seeded, so the same rounds always give the same interval."""
    if len(values) < 4:
        return float("nan"), float("nan")
    draw = random.Random(0).choices
    medians = sorted(statistics.median(draw(values, k=len(values))) for _ in range(resamples))
    tail = (1 - share) / 2
    return medians[int(tail * resamples)], medians[int((1 - tail) * resamples) - 1]


def round_ratios(samples, name, baseline):
    """name/baseline for each round, both measured in the same round."""
    return [a / b for a, b in zip(samples[name], samples[baseline]) if b]


def paired_ratio(samples, name, baseline):
    """Median over rounds of name/baseline measured in the same round (robust to drift)."""
    return median(round_ratios(samples, name, baseline))


def interval_text(interval):
    """`` (90 % of medians 0.57–0.63)``: where the bootstrap puts a per-round median."""
    low, high = interval
    if math.isnan(low):  # too few rounds (a quick run)
        return ""
    return f" (90 % of medians {low:.2f}–{high:.2f})"


def percentile(values, share):
    """Return the nearest-rank ``share`` (0..1) percentile of ``values`` (NaN when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(math.ceil(share * len(ordered)) - 1, 0)]


def timings(samples):
    """Return name -> {median_us, samples_us}: how the sections keep ``interleave``'s samples
    in the JSON."""
    return {name: {"median_us": median(values), "samples_us": values}
            for name, values in samples.items()}


def spread(values):
    """Relative interquartile range, to show how noisy a median is."""
    if len(values) < 4:
        return float("nan")
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def table(headers, rows):
    """Return a markdown table."""
    def cell(value):
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def verdict(ok):
    return "met" if ok else "NOT met"
