"""Profile the HTTP path in process: Django's WSGI handler serving bench/urls.py's DRF view, as
the gunicorn workers of the HTTP section do, without sockets (so the figures are the Python
the server runs per request, with less noise than wrk).

    .venv/bin/python bench/profile_path.py                 # µs per request: none, lua, ours
    .venv/bin/python bench/profile_path.py --fake-store    # ours without Redis (canned reply)
    .venv/bin/python bench/profile_path.py --profile ours  # cProfile of ours, top functions

``--fake-store`` answers take.lua with the reply of one real call, so the difference between
"ours" and "none" is the limiter's Python alone (the bare Lua throttle then still calls Redis).
Not a section of ``make bench``: a tool for finding where the per-request µs go.
"""

import argparse
import cProfile
import gc
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import Environment  # noqa: E402


class NoopThrottle:
    """A throttle that allows everything: what DRF's throttle loop costs by itself."""

    def allow_request(self, request, view):
        return True


def handlers(detail=False):
    """Return {variant: wsgi callable} for none, lua and ours (only the view's throttle and the
    middleware list differ, as between the HTTP section's servers)."""
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler

    from bench.throttles import BareLuaThrottle
    from bench.urls import Item
    from ratelimit_app.throttling import QuotaThrottle

    base = [m for m in settings.MIDDLEWARE if m != "ratelimit_app.middleware.QuotaMiddleware"]
    ours_middleware = base + ["ratelimit_app.middleware.QuotaMiddleware"]
    variants = {"none": ([], base), "lua": ([BareLuaThrottle], base),
                "ours": ([QuotaThrottle], ours_middleware)}
    if detail:  # where ours' extra µs are: the middleware alone, DRF's throttle loop alone
        variants.update({"middleware-only": ([], ours_middleware),
                         "noop-throttle": ([NoopThrottle], base)})
    built = {}
    for name, (throttles, middleware) in variants.items():
        settings.MIDDLEWARE = middleware
        handler = WSGIHandler()

        def app(environ, start_response, handler=handler, throttles=throttles):
            Item.throttle_classes = throttles
            return handler(environ, start_response)
        built[name] = app
    return built


def environ():
    return {"REQUEST_METHOD": "GET", "PATH_INFO": "/item/", "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000", "REMOTE_ADDR": "127.0.0.1", "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(b""), "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_HOST": "127.0.0.1:8000", "HTTP_ACCEPT": "*/*"}


def request(app):
    statuses = []
    body = b"".join(app(environ(), lambda status, headers: statuses.append(status)))
    assert statuses[0].startswith("200"), (statuses, body)


def fake_store():
    """Answer take.lua with the reply of one real call (no Redis on ours' path)."""
    from ratelimit_app.runtime.limiter import default_limiter

    store = default_limiter().store
    real_take = store.take
    canned = {}

    def take(bucket_keys, args, *, version_key):
        key = tuple(bucket_keys)
        if key not in canned:
            canned[key] = real_take(bucket_keys, args, version_key=version_key)
        return canned[key]
    store.take = take


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fake-store", action="store_true")
    parser.add_argument("--profile", metavar="VARIANT")
    parser.add_argument("--detail", action="store_true",
                        help="also time the middleware alone and a no-op throttle")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=2000)
    options = parser.parse_args()
    env = Environment()
    try:
        env.start()
        apps = handlers(options.detail)
        if options.fake_store:
            fake_store()
        for app in apps.values():
            for _ in range(500):
                request(app)
        if options.profile:
            app = apps[options.profile]
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(options.batch * 5):
                request(app)
            profiler.disable()
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(45)
            stats.sort_stats("cumulative").print_stats("ratelimit_app", 40)
            stats.sort_stats("tottime").print_stats("ratelimit_app|profile_path|functools", 60)
            return
        samples = {name: [] for name in apps}
        for round_number in range(options.rounds):
            for name, app in apps.items():
                gc.collect()
                started = time.perf_counter_ns()
                for _ in range(options.batch):
                    request(app)
                samples[name].append((time.perf_counter_ns() - started) / options.batch / 1000)
        none = samples["none"]
        for name, values in samples.items():
            extra = statistics.median([v - n for v, n in zip(values, none)])
            print(f"{name:5} {statistics.median(values):7.1f} µs/request   "
                  f"+{extra:6.1f} µs over none (paired median)")
        print("ours - lua: %.1f µs (paired median)" % statistics.median(
            [o - b for o, b in zip(samples["ours"], samples["lua"])]))
    finally:
        env.stop()


if __name__ == "__main__":
    main()
