"""DRF throttle classes for the HTTP benchmark's alternatives (ours is QuotaThrottle itself), and
the bare Lua throttle as an async middleware for the ASGI rows."""

import asyncio
import weakref

import redis.asyncio
from asgiref.sync import markcoroutinefunction
from django.conf import settings
from django.http import HttpResponse
from django_ratelimit.core import is_ratelimited
from rest_framework.throttling import BaseThrottle

from . import naive


class BareLuaThrottle(BaseThrottle):
    """The bare floor over HTTP: the naive 4-key script keyed by client address."""

    def allow_request(self, request, view):
        client = request._request.META.get("REMOTE_ADDR", "")
        return naive.take_naive(naive.naive_keys(client), naive.naive_args())


class DjangoRatelimitThrottle(BaseThrottle):
    """django-ratelimit's check (fixed window counter, cache.add + cache.incr) per client IP."""

    def allow_request(self, request, view):
        return not is_ratelimited(request._request, group="bench", key="ip",
                                  rate="1000000/s", increment=True)


class AsyncBareLuaMiddleware:
    """The bare floor under ASGI, as an async user would write it: the naive 4-key script by
    client address through redis.asyncio's ordinary client (one per event loop), awaited in an
    async middleware before every view (a DRF view, an async view)."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        markcoroutinefunction(self)
        self._scripts = weakref.WeakKeyDictionary()  # event loop -> the script on its client

    def _script(self):
        loop = asyncio.get_running_loop()
        script = self._scripts.get(loop)
        if script is None:
            client = redis.asyncio.Redis.from_url(settings.CACHES["default"]["LOCATION"])
            script = self._scripts[loop] = client.register_script(naive.source())
        return script

    async def __call__(self, request):
        client = request.META.get("REMOTE_ADDR", "")
        reply = await self._script()(keys=naive.naive_keys(client), args=naive.naive_args())
        if reply[0] != 1:
            return HttpResponse(status=429)
        return await self.get_response(request)
