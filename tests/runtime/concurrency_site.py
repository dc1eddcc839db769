"""Settings and views for tests/runtime/test_concurrency_limits.py's gunicorn and uvicorn: the demo
project plus slow
views that count, in Redis, how many of their requests are in flight at once."""

import asyncio
import os
import time

import redis
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path

from project.settings import *  # noqa: F401,F403

ROOT_URLCONF = "tests.runtime.concurrency_site"

_redis = redis.Redis.from_url(os.environ["REDIS_URL"])


def _in_flight(name):
    """Count this request in ``inflight:<name>``; note the count seen in ``seen:<name>``."""
    now = _redis.incr(f"inflight:{name}")
    _redis.rpush(f"seen:{name}", now)


def _done(name):
    _redis.decr(f"inflight:{name}")


def slow(request):
    _in_flight("slow")
    try:
        time.sleep(float(request.GET.get("s", "0.3")))  # the workload
    finally:
        _done("slow")
    return HttpResponse(f"pid {os.getpid()}")


def boom(request):
    raise RuntimeError("the view failed")


def stream(request):
    def chunks():
        for i in range(3):
            time.sleep(0.05)  # the workload
            yield f"chunk {i}\n".encode()
    return StreamingHttpResponse(chunks())


def hang(request):
    _redis.set("hang:pid", os.getpid())
    time.sleep(30)  # the workload: its worker is killed meanwhile
    return HttpResponse("late")


def both(request):
    time.sleep(float(request.GET.get("s", "0")))  # the workload
    return HttpResponse("ok")


async def aslow(request):
    """An async view (for uvicorn): no thread held while it waits."""
    await asyncio.sleep(float(request.GET.get("s", "0.5")))  # the workload
    return HttpResponse("ok")


urlpatterns = [
    path("aslow/", aslow, name="aslow"),
    path("slow/", slow, name="slow"),
    path("boom/", boom, name="boom"),
    path("stream/", stream, name="stream"),
    path("hang/", hang, name="hang"),
    path("both/", both, name="both"),
    path("health/", lambda request: HttpResponse("ok"), name="health"),
]
