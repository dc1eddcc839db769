"""Metered costs (decision/meter.py): a request admitted on its endpoint's estimate and charged,
once its response is finished, what its view reported with ``request.ratelimit.charge()`` or the
REPORTED_COST_HEADER header; through QuotaMiddleware and QuotaThrottle, against the suite's
real redis-server, at a test clock's time (no refill between requests unless the test says)."""

import logging

import pytest
from django.http import HttpResponse, StreamingHttpResponse
from django.test import Client, RequestFactory
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from ratelimit_app.business.usage.rollup import UsageRollup
from ratelimit_app.decision import engine
from ratelimit_app.decision.engine import Decision
from ratelimit_app.decision.identity import identify
from ratelimit_app.decision.meter import MAX_REPORTED_UNITS, Meter
from ratelimit_app.models import EndpointCost, Plan, QuotaAlert, Rule, UsageRecord

from ..helpers import commands_sent, limiter, use_fake_clock

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.runtime.test_metered")]

ESTIMATE, BURST, DEBT = 10, 100, 50


# --- the views --------------------------------------------------------------------------------

def consumed(request):
    """Reports ?units= (several charge() calls when ?calls= says so); ?header= instead puts it
    in the response header."""
    units, calls = request.GET.get("units"), int(request.GET.get("calls", 1))
    if units is not None:
        for _ in range(calls):
            request.ratelimit.charge(int(units) // calls)
    response = HttpResponse("done")
    if "header" in request.GET:
        response["X-Quota-Consumed"] = request.GET["header"]
    return response


def failing(request):
    request.ratelimit.charge(3)
    raise RuntimeError("the view failed after consuming 3 units")


def streamed(request):
    """Streams ?chunks= chunks, each reporting 5 units as it is produced."""
    def chunks():
        for number in range(int(request.GET["chunks"])):
            request.ratelimit.charge(5)
            yield f"chunk {number}\n"
    return StreamingHttpResponse(chunks(), content_type="text/plain")


class DrfConsumed(APIView):
    permission_classes = [AllowAny]

    def get(self, request):
        request.ratelimit.charge(int(request.query_params["units"]))
        return Response({"ok": True})


urlpatterns = [
    path("consumed/", consumed, name="consumed"),
    path("failing/", failing, name="failing"),
    path("streamed/", streamed, name="streamed"),
    path("drf/", DrfConsumed.as_view(), name="drf"),
    path("unmetered/", consumed, name="unmetered"),
]


# --- fixtures and helpers ----------------------------------------------------------------------

@pytest.fixture
def clock():
    return use_fake_clock()


@pytest.fixture
def metered(clock):
    """An IP rule of BURST tokens (1 a second), DEBT allowed; the four metered endpoints with
    an estimate of ESTIMATE and a minimum of 1; a call-counting rule on "consumed"."""
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    rule = Rule(name="units", plan=plan, scope="ip", rate=1, period_s=1, burst=BURST, debt=DEBT)
    rule.full_clean()
    rule.save()
    Rule.objects.create(name="consumed-calls", plan=plan, scope="ip", endpoint="consumed",
                        rate=1, period_s=3600, burst=1000)
    for endpoint in ("consumed", "failing", "streamed", "drf"):
        EndpointCost.objects.create(endpoint=endpoint, cost=ESTIMATE, metered=True, minimum=1)
    EndpointCost.objects.create(endpoint="unmetered", cost=ESTIMATE)
    return rule


def remaining(name="units"):
    """The tokens left in a bucket of the test client's, read without debiting it."""
    snapshot = limiter().snapshot()
    identity = identify(RequestFactory().get("/"), None, snapshot)
    buckets = [b for b in engine.plan_buckets(snapshot, identity, "consumed", ESTIMATE)
               if b.rule.name == name]
    [status], _ = limiter().peek_buckets(buckets)
    return status.level_units // buckets[0].period_ms  # below 0 in debt


def get(url):
    return Client().get(url)


# --- what a request is charged ---------------------------------------------------------------

@pytest.mark.parametrize("reported, charged", [(30, 30), (2, 2), (0, 1), (None, ESTIMATE)],
                         ids=["more", "less", "below-the-minimum", "nothing-reported"])
def test_a_request_is_charged_what_it_reported(metered, reported, charged):
    response = get("/consumed/" + ("" if reported is None else f"?units={reported}"))
    assert response.status_code == 200
    # admitted on the estimate: the headers say what the admission left
    assert f"r={BURST - ESTIMATE}" in response["RateLimit"]
    assert remaining() == BURST - charged


def test_reports_add_up(metered):
    assert get("/consumed/?units=36&calls=3").status_code == 200  # 12 + 12 + 12
    assert remaining() == BURST - 36


def test_a_report_equal_to_the_estimate_costs_no_second_call(metered, redis_client):
    limiter().snapshot()  # compiled, its version read: the requests send their own calls only
    with commands_sent(redis_client) as sent:
        assert get(f"/consumed/?units={ESTIMATE}").status_code == 200
    assert [c.split()[0] for c in sent] == ["evalsha"]  # the admission's take.lua alone
    with commands_sent(redis_client) as sent:
        assert get("/consumed/?units=11").status_code == 200
    # and its settle, after settle.lua is loaded (once, before a store's first settle)
    assert [c.split()[0] for c in sent] == ["evalsha", "script", "evalsha"]
    with commands_sent(redis_client) as sent:
        assert get("/consumed/?units=12").status_code == 200
    assert [c.split()[0] for c in sent] == ["evalsha", "evalsha"]
    assert remaining() == BURST - ESTIMATE - 11 - 12


def test_an_endpoint_rule_keeps_counting_calls(metered):
    get("/consumed/?units=40")
    assert remaining("consumed-calls") == 1000 - 1


def test_the_reported_header_is_read_and_never_sent(metered):
    response = get("/consumed/?header=40")
    assert "X-Quota-Consumed" not in response
    assert remaining() == BURST - 40


def test_a_bad_reported_header_is_logged_and_the_estimate_charged(metered, caplog):
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        response = get("/consumed/?header=lots")
    assert response.status_code == 200 and "X-Quota-Consumed" not in response
    assert "ignored X-Quota-Consumed response header 'lots'" in caplog.text
    assert remaining() == BURST - ESTIMATE


# --- debt -------------------------------------------------------------------------------------

def test_a_bucket_goes_into_debt_down_to_its_bound_and_refuses_until_repaid(metered, clock):
    assert get(f"/consumed/?units={BURST + DEBT + 500}").status_code == 200
    assert remaining() == -DEBT  # what would go further is not charged
    refused = get("/consumed/")
    assert refused.status_code == 429
    # nothing left, and the refill (1 a second) repays the debt, then brings the estimate
    assert f'"units";r=0;t={DEBT + ESTIMATE}' in refused["RateLimit"]
    assert int(refused["Retry-After"]) >= DEBT + ESTIMATE
    clock.advance((DEBT + ESTIMATE - 1) * 1000)
    assert get("/consumed/").status_code == 429
    clock.advance(1000)
    assert get("/consumed/").status_code == 200


# --- when the response is not an ordinary one -------------------------------------------------

def test_a_stream_is_charged_what_it_produced_when_the_client_leaves(metered):
    response = get("/streamed/?chunks=10")
    content = iter(response.streaming_content)
    next(content), next(content), next(content)  # 3 of 10 chunks read, then the client is gone
    assert remaining() == BURST - ESTIMATE  # not settled while the stream is open
    response.close()
    assert remaining() == BURST - 15
    response.close()  # a second close settles nothing more
    assert remaining() == BURST - 15


def test_a_stream_read_to_its_end_is_charged_all_of_it(metered):
    response = get("/streamed/?chunks=8")
    assert b"".join(response.streaming_content).count(b"chunk") == 8
    response.close()
    assert remaining() == BURST - 40


def test_a_view_that_raised_is_charged_what_it_reported(metered):
    client = Client(raise_request_exception=False)
    assert client.get("/failing/").status_code == 500
    assert remaining() == BURST - 3


def test_a_drf_view_charges_through_the_throttles_decision(metered):
    assert get("/drf/?units=25").status_code == 200
    assert remaining() == BURST - 25


# --- mistakes -------------------------------------------------------------------------------

def test_charge_on_an_endpoint_that_is_not_metered_is_logged_and_changes_nothing(metered,
                                                                                  caplog):
    Rule.objects.filter(name="consumed-calls").update(endpoint="unmetered")
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"):
        assert get("/unmetered/?units=40").status_code == 200
    assert "charge(40) on endpoint 'unmetered', whose cost is not metered" in caplog.text
    assert remaining() == BURST - ESTIMATE


@pytest.mark.parametrize("units, error", [(-1, ValueError), (MAX_REPORTED_UNITS + 1, ValueError),
                                          (2.5, TypeError), (True, TypeError), ("3", TypeError)])
@pytest.mark.parametrize("is_metered", [True, False], ids=["metered", "unmetered"])
def test_a_bad_charge_raises_a_clear_error_and_changes_nothing(units, error, is_metered):
    meter = Meter((), ESTIMATE, 1) if is_metered else None
    decision = Decision(allowed=True, meter=meter)
    with pytest.raises(error, match="charge\\(\\) takes"):
        decision.charge(units)
    if meter is not None:
        assert meter.reported is None and meter.close() == 0


def test_without_the_middleware_a_metered_endpoint_is_charged_its_estimate(metered, settings):
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "QuotaMiddleware" not in m]
    response = get("/drf/?units=25")
    assert response.status_code == 200 and response.wsgi_request.ratelimit.meter is None
    assert remaining() == BURST - ESTIMATE


# --- what the metrics, usage and alerts count -------------------------------------------------

def test_usage_records_count_the_settled_units(metered):
    for units in (30, 2, 0):
        get(f"/consumed/?units={units}")
    get("/consumed/")  # nothing reported: the estimate
    limiter().flusher.flush_now()
    UsageRollup(limiter().store.metrics_client()).run()
    record = UsageRecord.objects.get(rule="units")
    assert (record.units, record.allowed) == (30 + 2 + 1 + ESTIMATE, 4)


def test_a_settle_raises_the_alerts_of_the_thresholds_it_crosses(metered):
    Rule.objects.filter(name="units").update(period_s=3600, alert_thresholds="50,100")
    # admitted at 10 % used; settled 20 tokens into debt: past 50 % and 100 % at once
    assert get(f"/consumed/?units={BURST + 20}").status_code == 200
    assert QuotaAlert.objects.count() == 0 and not limiter().alerts.drain()
    # the thresholds are checked once the settle's reply is read (the metrics flush reads it
    # when the connection is not used meanwhile)
    limiter().flusher.flush_now()
    limiter().alerts.drain()
    assert sorted(QuotaAlert.objects.values_list("threshold", "used", "limit")) == \
        [(50, BURST + 20, BURST), (100, BURST + 20, BURST)]


def test_a_refund_raises_no_alert(metered):
    Rule.objects.filter(name="units").update(period_s=3600, alert_thresholds="5")
    assert get("/consumed/?units=2").status_code == 200  # admitted at 10 %: its alert
    limiter().alerts.drain()
    assert list(QuotaAlert.objects.values_list("threshold", "used")) == [(5, ESTIMATE)]
