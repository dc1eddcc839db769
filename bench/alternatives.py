"""In-process callables for each contender of the decision-cost comparison.

Each builder returns a zero-argument function making one complete decision, the way its library
makes it inside a request (DRF builds a new throttle object per request, so we do too).
"""

import itertools

from django.core.cache import cache
from django.http import HttpResponse
from django.test import RequestFactory
from django.urls import resolve
from django_ratelimit.core import is_ratelimited
from rest_framework.request import Request
from rest_framework.throttling import UserRateThrottle

from ratelimit_app.decision import engine
from ratelimit_app.decision.headers import apply_headers
from ratelimit_app.decision.meter import Meter
from ratelimit_app.runtime import guard
from ratelimit_app.runtime.limiter import default_limiter

from . import naive


def django_request(path="/item/", ip="10.1.2.3", user=None):
    """A Django request as the view would see it (URL resolved, user set)."""
    request = RequestFactory().get(path, REMOTE_ADDR=ip)
    request.resolver_match = resolve(path)
    request.user = user
    return request


def ours(user, path="/item/", ip="10.1.2.3"):
    """The whole path: guard.decide (identity, policy, buckets, Lua, metrics) + headers."""
    request = django_request(path, ip, user)
    response = HttpResponse()
    attr = guard.DECISION_ATTR

    def decide():
        request.__dict__.pop(attr, None)  # a new request each time, as far as the guard knows
        apply_headers(response, guard.decide(request, user))
    return decide


def ours_settle(user, extra, path="/item/", ip="10.1.2.3"):
    """The settle of a metered request on the buckets ``ours`` charges (4 levels), as
    ``Limiter.settle_metered`` runs it after the response: its meter closed, then settle.lua
    for ``extra`` tokens more than its estimate, then as many fewer, alternately (the levels
    stay where they are), sent without waiting for its reply (read with those of the settles
    sent after it, once MAX_UNANSWERED are owed: each call pays its share of the reads, as in a
    worker, whose next decision reads them); ``extra`` 0: the estimate was right, and no call
    is made. (Not its
    count in the metrics: that is the decision's own count, which a metered decision defers to
    its settle.)"""
    request = django_request(path, ip, user)
    decision = guard.decide(request, user)
    limiter = default_limiter()
    buckets = tuple(engine.settled_buckets(engine.plan_buckets(
        limiter.snapshot(), decision.identity, decision.endpoint, decision.cost)))
    # admitted for ``extra`` (what the buckets hold is not the point), reporting twice that
    # or nothing: settles of +extra and -extra
    reports = itertools.cycle((2 * extra, 0))

    def settle():
        meter = Meter(buckets, extra, 0)
        meter.add(next(reports))
        difference = meter.close()
        if difference:
            limiter.settle_units_later(buckets, difference, _ignore)
    return settle


def _ignore(reply):
    """What ``ours_settle`` does with a settle's reply once read: what Limiter.settle_metered
    does with it is counting the request, which the bench leaves to the decision's figure."""


def floor(client_id="floor-client", levels=naive.LEVELS):
    keys, args = naive.naive_keys(client_id, levels), naive.naive_args(levels)
    return lambda: naive.take_naive(keys, args)


def cache_get():
    cache.set("bench:get", b"x" * 16)
    return lambda: cache.get("bench:get")


def drf_user_throttle(user, history):
    """DRF's UserRateThrottle with a steady history of ``history`` timestamps.

    The throttle's clock advances one second per call and its window is ``history`` seconds, so
    each call drops exactly one old entry and adds one: the history stays at its size, as it does
    for a client sending at a steady rate (every call is allowed).
    """
    clock = itertools.count(10**9)

    class SteadyUserRateThrottle(UserRateThrottle):
        scope = f"user-{history}"
        rate = "steady"

        def parse_rate(self, rate):
            return history + 1, history

        def timer(self):
            return next(clock)

    start = next(clock)
    cache.set(f"throttle_user-{history}_{user.pk}", [start - i for i in range(history)], 3600)
    request = Request(django_request(user=user))
    request.user = user

    def decide():
        assert SteadyUserRateThrottle().allow_request(request, None)
    return decide


def django_ratelimit(user):
    request = django_request(user=user)

    def decide():
        return is_ratelimited(request, group="bench", key="user", rate="100000000/s",
                              increment=True)
    return decide
