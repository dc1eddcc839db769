"""Settings and views for tests/runtime/test_credits_servers.py's gunicorn and uvicorn:
metered_site's metered views and sync stream, an async stream of its own, a plain view and an
endpoint-limited one, and
test-only operations the test asks a server to run in its own process on the shared database
(an API key, a top-up, ``manage.py ratelimit rollup``, an account's ledger), so that a step
costs a request, not a Django start-up. (A settings module: the models are imported in the
views, once the apps are loaded.)"""

import asyncio
import io
import os
import uuid

import redis

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db.models import Sum
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from project.settings import *  # noqa: F401,F403
from ratelimit_app.decorators import ratelimit_exempt

from .metered_site import CHUNK, CHUNK_UNITS, aunits, stream, units

ROOT_URLCONF = "tests.runtime.credits_site"

_notes = redis.Redis.from_url(os.environ["NOTES_REDIS_URL"])  # where the test reads them

PLAN = "prepaid"  # the plan test_credits_servers.SETUP gives its credits rule


def astream(request):
    """metered_site's async stream, noting what it produced once it is closed: awaiting a
    redis.asyncio call per chunk, as metered_site's does, makes the stream run to its end when
    Django cancels it (redis-py 8.1 loses most cancellations of a task awaiting a command), and
    this test is about the balance, not about the notes."""
    name = request.GET["id"]

    async def chunks():
        produced = 0
        try:
            for _ in range(10_000):
                request.ratelimit.charge(CHUNK_UNITS)
                produced += CHUNK_UNITS
                yield CHUNK
                await asyncio.sleep(0)  # where Django's cancellation reaches the stream
        finally:
            _notes.mset({f"produced:{name}": produced, f"closed:{name}": 1})
    return StreamingHttpResponse(chunks(), content_type="application/octet-stream")


def plain(request):
    """Costs its endpoint cost (1): no endpoint rule, not metered."""
    return HttpResponse("plain")


def ok(request):
    """The same, under the tenant's endpoint rule (SETUP's ``ok-per-tenant``)."""
    return HttpResponse("ok")


def operation(view):
    """A test-only operation: never limited, no CSRF token, its answer as JSON."""
    def run(request):
        return JsonResponse(view(request.GET))
    return csrf_exempt(ratelimit_exempt(run))


@operation
def new_key(query):
    """An API key on the prepaid plan in the tenant ``tenant``: its raw key and account."""
    from ratelimit_app.models import ApiKey, Plan

    user = get_user_model().objects.create_user(f"payer-{uuid.uuid4().hex[:12]}")
    api_key, raw = ApiKey.create_key(user, "credits", plan=Plan.objects.get(slug=PLAN),
                                     tenant=query["tenant"])
    return {"raw": raw, "ref": f"key:{api_key.pk}"}


@operation
def credit(query):
    """``top_up`` as the admin, the command and the staff API do it (Redis told after the
    commit)."""
    from ratelimit_app.business.credits.ledger import client_of, top_up
    from ratelimit_app.runtime.limiter import default_limiter

    made, created = top_up(query["ref"], int(query["units"]), query["id"], actor="test",
                           client=client_of(default_limiter().store))
    return {"created": created, "granted": made.account.granted}


@operation
def rollup(query):
    """``manage.py ratelimit rollup`` (the usage rollup, then the credits checkpoint)."""
    out = io.StringIO()
    call_command("ratelimit", "rollup", stdout=out)
    return {"output": out.getvalue()}


@operation
def ledger(query):
    """The account row of ``ref`` and its usage records summed per rule."""
    from ratelimit_app.models import CreditAccount, UsageRecord

    account = CreditAccount.objects.get(ref=query["ref"])
    usage = {row["rule"]: row for row in UsageRecord.objects.filter(identity=query["ref"])
             .values("rule").annotate(units=Sum("units"), allowed=Sum("allowed"),
                                      refused=Sum("refused"))}
    return {"granted": account.granted, "spent": account.spent, "seq": account.seq,
            "usage": usage}


urlpatterns = [
    path("units/", units, name="units"),
    path("aunits/", aunits, name="aunits"),
    path("stream/", stream, name="stream"),
    path("astream/", astream, name="astream"),
    path("plain/", plain, name="plain"),
    path("ok/", ok, name="ok"),
    path("ops/key/", new_key),
    path("ops/top-up/", credit),
    path("ops/rollup/", rollup),
    path("ops/ledger/", ledger),
    path("health/", lambda request: HttpResponse("ok"), name="health"),
]
