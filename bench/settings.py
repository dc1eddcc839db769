"""Settings of the benchmark servers and processes: the demo project's, pointed at the
benchmark's own Redis and SQLite file, with the throttle chosen by ``BENCH_VARIANT``.

Variants (all serve the same DRF view, so only the throttle differs):
    none       no throttle at all
    ours       ratelimit_app.throttling.QuotaThrottle (+ QuotaMiddleware for the headers)
    lua        a bare 4-key Lua token bucket (bench/naive.py), no headers, no policy
    drf        DRF AnonRateThrottle, rate per second (its most favourable window: a short history)
    drf-min    DRF AnonRateThrottle, rate per minute (the usual window: the history grows)
    ratelimit  django-ratelimit's is_ratelimited
    take, take-fields   the ASGI rows' floors (async middlewares, below)
"""

import os

from project.settings import *  # noqa: F401,F403
from project.settings import INSTALLED_APPS, REST_FRAMEWORK

VARIANT = os.environ.get("BENCH_VARIANT", "ours")

DEBUG = False
ROOT_URLCONF = "bench.urls"
INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "project.demo"] + ["bench"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("BENCH_SQLITE_PATH", "/nonexistent/bench.sqlite3"),
    }
}

# Only what every variant needs; the limiter's own middleware only where it is measured.
MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
if VARIANT == "ours":
    MIDDLEWARE.append("ratelimit_app.middleware.QuotaMiddleware")

_THROTTLES = {
    "none": [],
    "ours": ["ratelimit_app.throttling.QuotaThrottle"],
    "lua": ["bench.throttles.BareLuaThrottle"],
    "drf": ["rest_framework.throttling.AnonRateThrottle"],
    "drf-min": ["rest_framework.throttling.AnonRateThrottle"],
    "ratelimit": ["bench.throttles.DjangoRatelimitThrottle"],
    "take": [],
    "take-fields": [],
}
REST_FRAMEWORK = {
    **REST_FRAMEWORK,
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_THROTTLE_CLASSES": _THROTTLES[VARIANT],
    # Generous: the benchmark measures the allowed path. DRF keeps one timestamp per request of
    # its window in its history: about as many entries as requests per second with "/s", and
    # growing through the whole run (up to 60 s of requests) with "/min".
    # Only DRF's variants name rates: with ours, migrate would import them as plans beside the
    # fixtures' (ratelimit_app/config/drf_rates.py).
    "DEFAULT_THROTTLE_RATES": {"anon": "100000000/min", "user": "100000000/min"}
    if VARIANT == "drf-min" else {"anon": "1000000/s", "user": "1000000/s"}
    if VARIANT == "drf" else {},
    "UNAUTHENTICATED_USER": None,
}

# The ASGI row (servers.Uvicorn): the middleware decides DRF views too, so the decision is made
# on the event loop (QuotaThrottle reuses it: one charge per request).
# The bare Lua throttle decides there too, as an async middleware (redis.asyncio), for both views.
if os.environ.get("BENCH_MIDDLEWARE_DECIDES"):
    RATELIMIT_APP = {**RATELIMIT_APP, "MIDDLEWARE_INCLUDES_DRF": True}  # noqa: F405
    if VARIANT == "lua":
        MIDDLEWARE.append("bench.throttles.AsyncBareLuaMiddleware")
        REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"] = []
# The floors of the ASGI rows (async def view only): ours' take.lua call alone, then with ours'
# header fields (bench/throttles.py).
if VARIANT == "take":
    MIDDLEWARE.append("bench.throttles.AsyncTakeAloneMiddleware")
if VARIANT == "take-fields":
    MIDDLEWARE.append("bench.throttles.AsyncTakeAndFieldsMiddleware")

# The config propagation section (bench/propagation.py): each response names the config version
# that decided it and the worker, and the watcher's poll interval is set per server.
if os.environ.get("BENCH_EXPOSE_CONFIG_VERSION"):
    RATELIMIT_APP = {**RATELIMIT_APP, "EXPOSE_CONFIG_VERSION": True}  # noqa: F405
if os.environ.get("BENCH_CONFIG_WATCH_INTERVAL_S"):
    RATELIMIT_APP = {**RATELIMIT_APP,  # noqa: F405
                     "CONFIG_WATCH_INTERVAL_S": float(os.environ["BENCH_CONFIG_WATCH_INTERVAL_S"])}

SILENCED_SYSTEM_CHECKS = ["django_ratelimit.W001"]
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "loggers": {"ratelimit_app": {"level": "ERROR"}}}
