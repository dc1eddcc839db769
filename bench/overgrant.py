"""4. Over-grant: 8 processes × 8 threads hammer ONE key for 3 s with burst 10, 10 per second.
Counts the requests each limiter allowed against the most its own rule permits."""

import math
import multiprocessing
import os
import threading
import time

from .harness import table, verdict

PROCESSES, THREADS, SECONDS = 8, 8, 3.0
RATE, BURST = 10, 10


def _contender(name):
    """Return a zero-argument callable: True if one request is allowed (built in the worker)."""
    from django.contrib.auth import get_user_model

    from . import alternatives

    user = get_user_model().objects.get(username="overgrant")
    request = alternatives.django_request(user=user)
    if name == "ours":
        from ratelimit_app.runtime.limiter import default_limiter
        limiter = default_limiter()
        return lambda: limiter.decide(request, user, "bench:item").allowed
    if name == "drf":
        from rest_framework.request import Request
        from rest_framework.throttling import SimpleRateThrottle

        class OneKeyThrottle(SimpleRateThrottle):
            rate = f"{RATE}/s"

            def get_cache_key(self, request, view):
                return "overgrant-drf"
        drf_request = Request(request)
        return lambda: OneKeyThrottle().allow_request(drf_request, None)
    from django_ratelimit.core import is_ratelimited
    return lambda: not is_ratelimited(request, group="overgrant", key=lambda g, r: "one",
                                      rate=f"{RATE}/s", increment=True)


def _warm_up(name):
    """Load the policy snapshot and open connections without spending any token."""
    from django.core.cache import cache

    from ratelimit_app.runtime.limiter import default_limiter
    if name == "ours":
        default_limiter().snapshot()
        default_limiter().store.ping()
    else:
        cache.get("warm-up")


def _worker(name, ready, go, start_value, queue):
    import django
    django.setup()
    decide = _contender(name)
    _warm_up(name)
    ready.release()
    go.wait(120)
    start_at = start_value.value
    allowed, calls = [0] * THREADS, [0] * THREADS

    def hammer(slot):
        while time.time() < start_at:
            time.sleep(0.0005)  # wait for the common start line
        while time.time() < start_at + SECONDS:
            calls[slot] += 1
            if decide():
                allowed[slot] += 1
    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put((sum(allowed), sum(calls)))


def _run_one(name):
    context = multiprocessing.get_context("spawn")
    queue, ready, go = context.Queue(), context.Semaphore(0), context.Event()
    start_value = context.Value("d", 0.0)
    workers = [context.Process(target=_worker, args=(name, ready, go, start_value, queue))
               for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    for _ in workers:  # every worker set up and warm before the clock starts
        if not ready.acquire(timeout=120):
            raise RuntimeError("over-grant workers did not start")
    # start on a half second, so the fixed windows of django-ratelimit are easy to count
    start_at = math.floor(time.time()) + 1.5
    start_value.value = start_at
    go.set()
    results = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(30)
    return sum(a for a, _ in results), sum(c for _, c in results), start_at


def run(env, quick):
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    rows, results = [], {}
    for name, label in [("ours", "ours (atomic Lua bucket)"),
                        ("drf", "DRF SimpleRateThrottle 10/s"),
                        ("ratelimit", "django-ratelimit 10/s")]:
        env.client().flushall()
        allowed, calls, start_at = _run_one(name)
        end = start_at + SECONDS
        if name == "ours":
            most = BURST + RATE * SECONDS          # a full bucket, then the refill
        elif name == "drf":
            most = RATE * math.ceil(SECONDS)       # sliding 1 s window over 3 s
        else:
            most = RATE * (math.floor(end) - math.floor(start_at) + 1)  # fixed windows touched
        rows.append([label, calls, allowed, int(most), f"{allowed / most:.2f}×"])
        results[name] = {"allowed": allowed, "calls": calls, "max": most}
    ours = results["ours"]
    ok = ours["max"] - 2 <= ours["allowed"] <= ours["max"]
    markdown = table(["limiter", "calls", "allowed", "most its rule permits", "allowed ÷ max"],
                     rows)
    targets = [("5. over-grant: ours within [max − 2, max]",
                f"{ours['allowed']} of {int(ours['max'])}", verdict(ok))]
    return {"title": f"4. Over-grant ({PROCESSES} processes × {THREADS} threads, one key, "
                     f"{SECONDS:.0f} s, burst {BURST}, {RATE}/s)",
            "markdown": markdown, "results": results, "targets": targets,
            "ratios": {"overgrant.allowed_vs_max": ours["allowed"] / ours["max"]}}
