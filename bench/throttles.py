"""DRF throttle classes for the HTTP benchmark's alternatives (ours is QuotaThrottle itself), the
bare Lua throttle as an async middleware for the ASGI rows, and the two floors of those rows."""

import asyncio
import weakref

import redis.asyncio
from asgiref.sync import markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpResponse
from django.urls import resolve
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


class AsyncTakeAloneMiddleware:
    """The floor of the ASGI rows: ours' one take.lua call for this client (the same keys and
    arguments, sent through ours' async store on the same kind of connection) awaited before
    the view, and nothing else: no identity, no policy, no metrics, no header fields. What any
    limiter making that one call on the event loop costs at least; ours' distance from it is
    the Python of ours' decision and the fields it sends."""

    sync_capable = False
    async_capable = True
    with_fields = False

    def __init__(self, get_response):
        self.get_response = get_response
        markcoroutinefunction(self)
        self._planned = None  # (async store, keys, args, version key, header fields)

    def _plan(self, request):
        """Ours' take call and header fields for ``request``'s client, through ours' own path
        once (the database: in a thread)."""
        from ratelimit_app.decision.headers import apply_headers
        from ratelimit_app.runtime.limiter import default_limiter

        limiter = default_limiter()
        endpoint = resolve(request.path_info).view_name  # (a middleware runs before the view's
        # URL is resolved; the floors serve one view, so its take is the same for every request)
        decision = limiter.decide(request, None, endpoint)
        fields = HttpResponse()
        apply_headers(fields, decision)
        pending = limiter._prepare(limiter.snapshot(), request, None, endpoint, None)
        keys, args = limiter._take_call(pending.buckets, None, True)
        return (limiter.async_store(), tuple(keys), tuple(args), limiter.version_key,
                [(name, fields[name]) for name in ("RateLimit-Policy", "RateLimit")])

    async def __call__(self, request):
        if self._planned is None:
            self._planned = await sync_to_async(self._plan)(request)
        store, keys, args, version_key, fields = self._planned
        reply = await store.take(keys, args, version_key=version_key)
        if not reply.allowed:
            return HttpResponse(status=429)
        response = await self.get_response(request)
        if self.with_fields:
            for name, value in fields:  # (the values of the first request: the same length)
                response[name] = value
        return response


class AsyncTakeAndFieldsMiddleware(AsyncTakeAloneMiddleware):
    """The take alone, plus ours' RateLimit-Policy and RateLimit fields on every response (a
    limiter that sends the draft's fields pays for them in the server too)."""

    with_fields = True
