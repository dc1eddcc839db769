"""Settings and views for tests/runtime/test_metered_servers.py's gunicorn and uvicorn: the demo
project plus views that report what their requests consumed (``request.ratelimit.charge``) and
a stream that notes in Redis what it produced before its client left."""

import os

import redis
import redis.asyncio
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import path

from project.settings import *  # noqa: F401,F403

ROOT_URLCONF = "tests.runtime.metered_site"

# the Redis the test reads the stream's notes from (the limiter's may be a Cluster)
_notes = redis.Redis.from_url(os.environ["NOTES_REDIS_URL"])
_anotes = redis.asyncio.Redis.from_url(os.environ["NOTES_REDIS_URL"])
CHUNK_UNITS = 5
CHUNK = b"x" * 65_536  # big enough that a client gone is noticed after a few chunks


def units(request):
    """Reports ?n= units consumed."""
    request.ratelimit.charge(int(request.GET["n"]))
    return HttpResponse("ok")


async def aunits(request):
    """The same, as an async view (uvicorn runs it on the event loop)."""
    request.ratelimit.charge(int(request.GET["n"]))
    return HttpResponse("ok")


def stream(request):
    """Streams up to 10,000 chunks, each reporting CHUNK_UNITS as it is produced; notes the
    units it reported in ``produced:<id>``, and ``closed:<id>`` once the stream is closed."""
    name = request.GET["id"]

    def chunks():
        try:
            for _ in range(10_000):
                request.ratelimit.charge(CHUNK_UNITS)
                _notes.incrby(f"produced:{name}", CHUNK_UNITS)
                yield CHUNK
        finally:
            _notes.set(f"closed:{name}", 1)
    return StreamingHttpResponse(chunks(), content_type="application/octet-stream")


def astream(request):
    """``stream`` as an async iterator (what an ASGI server streams without consuming it
    whole first): its client gone, Django cancels it."""
    name = request.GET["id"]

    async def chunks():
        try:
            for _ in range(10_000):
                request.ratelimit.charge(CHUNK_UNITS)
                await _anotes.incrby(f"produced:{name}", CHUNK_UNITS)
                yield CHUNK
        finally:
            _notes.set(f"closed:{name}", 1)
    return StreamingHttpResponse(chunks(), content_type="application/octet-stream")


urlpatterns = [
    path("units/", units, name="units"),
    path("aunits/", aunits, name="aunits"),
    path("stream/", stream, name="stream"),
    path("astream/", astream, name="astream"),
    path("health/", lambda request: HttpResponse("ok"), name="health"),
]
