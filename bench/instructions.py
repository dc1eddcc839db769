"""Instructions per request, counted by valgrind: the HTTP rows' variants in process, ours'
store answering from a canned reply, so that what is counted is the Python each one runs.

    .venv/bin/python bench/instructions.py                        # every variant, ASGI and WSGI
    .venv/bin/python bench/instructions.py --kind asgi --variants none,ours --requests 2000

ASGI: Django's ASGIHandler serving the ``async def`` view (``/aitem/``), QuotaMiddleware in async
mode, as the uvicorn rows run it; the floors' middlewares (``take``, ``fields``) go through ours'
async store too. WSGI: Django's WSGIHandler serving the DRF view, as bench/profile_path.py.

Each figure is the difference between two runs under ``valgrind --tool=cachegrind`` (no cache
simulation), one of N requests and one of none, divided by N, with PYTHONHASHSEED fixed and the
garbage collector off after the warm-up (a collection landing in one run and not the other
would be noise here; the latency rows measure what collections cost). Repeated runs agree
within about 0.1 %, so it tells apart changes of a few per cent that wall-clock rounds on a
shared machine cannot. A count is not a time: a cache miss costs more than an addition. Not a
section of ``make bench``: it needs valgrind (Debian's ``valgrind``) and about a minute per
variant.
"""

import argparse
import asyncio
import gc
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASGI_VARIANTS = ("none", "take", "fields", "ours")
WSGI_VARIANTS = ("none", "ours")
WARM_UP = 200


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("asgi", "wsgi", "both"), default="both")
    parser.add_argument("--variants", help="comma-separated (default: every one of the kind)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "VARIANT", "N"),
                        help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        kind, variant, count = options.child
        serve(kind, variant, int(count))
        return
    kinds = ("asgi", "wsgi") if options.kind == "both" else (options.kind,)
    for kind in kinds:
        variants = options.variants.split(",") if options.variants else \
            (ASGI_VARIANTS if kind == "asgi" else WSGI_VARIANTS)
        counts = {variant: per_request(kind, variant, options.requests) for variant in variants}
        print(f"{kind.upper()} (instructions per request; {options.requests} requests)")
        for variant, count in counts.items():
            over = f"  +{count - counts['none']:,} over none" if "none" in counts else ""
            print(f"  {variant:7} {count:>11,}{over}")


def per_request(kind, variant, count):
    """Return the instructions one request of ``variant`` runs (see the module's docstring)."""
    return (instructions(kind, variant, count) - instructions(kind, variant, 0)) // count


def instructions(kind, variant, count):
    """Return the instructions a child serving ``count`` requests ran, all of it."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
               "--cachegrind-out-file=/dev/null", sys.executable, __file__,
               "--child", kind, variant, str(count)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONHASHSEED": "0"}, check=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", result.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{result.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def serve(kind, variant, count):
    """The child: warm ``variant`` up, stop what would run on a timer, serve ``count``."""
    sys.path.insert(0, str(ROOT))
    if kind == "asgi":
        os.environ["BENCH_MIDDLEWARE_DECIDES"] = "1"
    from bench.harness import Environment

    environment = Environment()
    try:
        environment.start()
        if kind == "asgi":
            asyncio.run(serve_asgi(variant, count))
        else:
            serve_wsgi(variant, count)
    finally:
        environment.stop()


def stop_background():
    """Stop the limiter's periodic work (the config watcher's GET every 50 ms, a version poll
    each second, a metrics flush, a comparison of the rows each 30 s). Under valgrind a second
    is a few dozen requests, so it would be counted many times over, and more of it the slower
    the machine runs: left running during the warm-up (the same in both runs, but not for the
    same wall time), the watcher made the count vary by 2 % with other sessions' load. Called
    once the server's middleware is built (it starts the watcher) and again after the warm-up
    (a compile resets the moments due)."""
    from ratelimit_app.runtime.limiter import default_limiter

    limiter = default_limiter()
    policies = limiter.policies
    policies.check_interval_s = math.inf  # first: a due poll would start the watcher again
    policies.compare_at = policies.switch_at = policies.due_at = math.inf
    policies.close()  # the watcher thread
    limiter.flusher.autostart = False
    limiter.flusher.stop()


def quiet():
    """After the warm-up: stop the periodic work (``stop_background``), then turn the
    collector off."""
    stop_background()
    gc.collect()
    gc.disable()


def serve_wsgi(variant, count):
    from bench import profile_path

    app = profile_path.handlers()[variant]
    profile_path.fake_store()
    stop_background()
    for _ in range(WARM_UP):
        profile_path.request(app)
    quiet()
    for _ in range(count):
        profile_path.request(app)


async def serve_asgi(variant, count):
    from django.conf import settings
    from django.core.handlers.asgi import ASGIHandler

    from ratelimit_app.runtime.limiter import default_limiter

    ours = "ratelimit_app.middleware.QuotaMiddleware"
    base = [m for m in settings.MIDDLEWARE if m != ours]
    settings.MIDDLEWARE = base + {
        "none": [], "take": ["bench.throttles.AsyncTakeAloneMiddleware"],
        "fields": ["bench.throttles.AsyncTakeAndFieldsMiddleware"], "ours": [ours]}[variant]
    app = ASGIHandler()
    stop_background()
    store = default_limiter().async_store()
    real_take, canned = store.take, {}

    async def canned_take(bucket_keys, args, *, version_key):
        key = tuple(bucket_keys)
        if key not in canned:
            canned[key] = await real_take(bucket_keys, args, version_key=version_key)
        return canned[key]
    store.take = canned_take
    for _ in range(WARM_UP):
        await asgi_request(app)
    quiet()
    for _ in range(count):
        await asgi_request(app)


async def asgi_request(app, path="/aitem/"):
    """One GET of ``path`` through ``app``, as an ASGI server would send it."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5555),
             "server": ("127.0.0.1", 8000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"accept", b"*/*")]}
    body = [{"type": "http.request", "body": b"", "more_body": False}]
    sent = []

    async def receive():
        if body:
            return body.pop()
        await asyncio.get_running_loop().create_future()  # (never: the view reads no more)

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    if sent[0]["status"] != 200:
        raise RuntimeError(f"{path} answered {sent[0]['status']}")


if __name__ == "__main__":
    sys.exit(main())
