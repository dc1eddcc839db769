"""bench/throttles.py's floors of the ASGI rows: an async middleware that sends ours' take.lua
call for the client (the same keys and arguments, debiting ours' buckets) and nothing else, and
one that also sets the RateLimit-Policy and RateLimit fields ours sends. Run in process on the
suite's redis-server; each call in ``async_to_sync`` from the test's thread, so the ORM work the
floor hands to a thread (planning the call once) sees the test's database."""

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import AnonymousUser
from django.http import HttpResponse
from django.test import RequestFactory

from bench.throttles import AsyncTakeAloneMiddleware, AsyncTakeAndFieldsMiddleware
from ratelimit_app.decision.headers import apply_headers
from ratelimit_app.models import Plan, Rule, Scope

from ..helpers import limiter

pytestmark = pytest.mark.django_db


@pytest.fixture
def rules(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "LOCAL_DENY_CACHE": False}
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="ip", plan=plan, scope=Scope.IP, rate=1, period_s=3600, burst=4)
    Rule.objects.create(name="hello", plan=plan, scope=Scope.IP, endpoint="hello", rate=1,
                        period_s=3600, burst=100)


def serve(middleware_class, requests, ip="192.0.2.7"):
    """Serve ``requests`` requests to /hello/ through one floor middleware; return the
    responses."""
    async def view(request):
        return HttpResponse("ok")

    middleware = middleware_class(view)

    async def run():
        try:
            return [await middleware(RequestFactory().get("/hello/", REMOTE_ADDR=ip))
                    for _ in range(requests)]
        finally:
            await limiter().async_store().aclose()

    return async_to_sync(run)()


@pytest.mark.parametrize("middleware_class", [AsyncTakeAloneMiddleware,
                                              AsyncTakeAndFieldsMiddleware])
def test_a_floor_sends_ours_take_for_the_client(middleware_class, rules, redis_server):
    # (a first decision loads the script: a NOSCRIPT reply counts as an EVALSHA call too)
    limiter().decide(RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.200"),
                     AnonymousUser(), "hello")
    before = redis_server.command_calls("evalsha")
    responses = serve(middleware_class, 4)
    # planning took one decision through ours' path, then one take per request: the ip
    # bucket's 4 tokens last for 3 requests, and the 4th is refused by ours' script
    assert redis_server.command_calls("evalsha") - before == 1 + 4
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    ours = limiter().decide(RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.7"),
                            AnonymousUser(), "hello")
    assert not ours.allowed and ours.violated == ("ip",)  # the floor debited ours' buckets


def test_only_the_fields_floor_sets_ours_fields(rules, redis_server):
    [alone] = serve(AsyncTakeAloneMiddleware, 1)
    [with_fields] = serve(AsyncTakeAndFieldsMiddleware, 1, ip="192.0.2.8")
    assert not alone.has_header("RateLimit-Policy") and not alone.has_header("RateLimit")
    ours = apply_headers(HttpResponse(), limiter().decide(
        RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.9"), AnonymousUser(), "hello"))
    assert with_fields["RateLimit-Policy"] == ours["RateLimit-Policy"] == \
        '"ip";q=4;w=14400, "hello";q=100;w=360000'
    # the levels of the floor's first request (the planning decision took one token first)
    assert with_fields["RateLimit"] == '"ip";r=3;t=3600, "hello";r=99;t=3600'
