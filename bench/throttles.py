"""DRF throttle classes for the HTTP benchmark's alternatives (ours is QuotaThrottle itself)."""

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
