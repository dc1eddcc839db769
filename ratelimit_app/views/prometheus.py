"""Optional Prometheus endpoint (needs ``prometheus-client``; see ``urls.py``).

Counters are the cluster-wide all-time totals every worker flushes to Redis (so any one worker
can be scraped and the numbers never go backwards); gauges describe the process that answers.
One counter is the answering process's own: ``ratelimit_process_unexpected_errors_total``
(unexpected errors on the decision path or in the metrics flush, by exception type: see
process/unexpected.py). It must not depend on the metrics flush, whose Redis client may be what is
broken; it restarts from 0 with the process, which ``rate()`` and ``increase()`` handle.
Off unless ``PROMETHEUS_ENABLED``; readable with ``Authorization: Bearer <PROMETHEUS_TOKEN>`` or
by staff with the dashboard permission.
"""

import hmac
import logging

from django.http import Http404, HttpResponse

from ..conf import get_config
from ..decorators import ratelimit_exempt
from ..runtime.limiter import default_limiter
from ..stores.base import READ_ERRORS
from .staff import is_staff_with

__all__ = ["metrics_view", "collect"]

logger = logging.getLogger("ratelimit_app")

_BREAKER_STATES = ("closed", "half-open", "open")


def _authorised(request):
    token = get_config()["PROMETHEUS_TOKEN"]
    if token:
        sent = request.headers.get("Authorization", "")
        if hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return True
    return is_staff_with(getattr(request, "user", None), "ratelimit_app.view_dashboard")


def collect():
    """Return the metric families to expose (a list of prometheus_client Metric objects)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    decisions = CounterMetricFamily(
        "ratelimit_decisions", "Requests decided, by outcome and dimension (rule, plan, endpoint).",
        labels=["dimension", "name", "outcome"])
    errors_total = CounterMetricFamily(
        "ratelimit_redis_errors", "Redis errors seen by all workers (flushed with the metrics).")
    up = GaugeMetricFamily("ratelimit_metrics_redis_up", "1 if Redis answered this scrape.")
    try:
        totals = default_limiter().reader.totals()
        up.add_metric([], 1)
    except Exception as exc:  # Redis down (READ_ERRORS), or a broken client: still answer
        if not isinstance(exc, READ_ERRORS):
            logger.warning("ratelimit_app: Prometheus scrape could not read the totals: %s: %s",
                           type(exc).__name__, exc)
        totals = {}
        up.add_metric([], 0)
    for (dimension, name, outcome), value in sorted(totals.items()):
        if dimension in ("rule", "plan", "endpoint", "all") and outcome in (
                "allowed", "denied", "shadow", "checked"):
            decisions.add_metric([dimension, name, outcome], value)
    errors_total.add_metric([], totals.get(("redis", "errors", "count"), 0))
    process_errors = GaugeMetricFamily(
        "ratelimit_process_redis_errors", "Redis errors seen by this process since it started.")
    limiter = default_limiter()
    process_errors.add_metric([], limiter.stats.redis_errors)
    breaker = GaugeMetricFamily(
        "ratelimit_breaker_state", "This process's circuit breaker: 1 for the current state.",
        labels=["state"])
    current = limiter.breaker.state
    for state in _BREAKER_STATES:
        breaker.add_metric([state], 1 if state == current else 0)
    buffered = GaugeMetricFamily(
        "ratelimit_metrics_buffered_decisions",
        "Decisions this process counted but has not written to Redis yet (they stay buffered "
        "while flushes fail and are added to the totals when Redis answers again).")
    buffered.add_metric([], limiter.recorder.pending_decisions()[0])
    unexpected = CounterMetricFamily(
        "ratelimit_process_unexpected_errors",
        "Unexpected errors (not Redis unavailability) in this process, by exception type: on "
        "the decision path (the request was let through unlimited) or in the metrics flush "
        "(its counts were kept for the next flush).",
        labels=["type"])
    for name, count in sorted(limiter.stats.unexpected_by_type.items()):
        unexpected.add_metric([name], count)
    return [decisions, errors_total, up, process_errors, unexpected, breaker, buffered]


class _Collector:
    def collect(self):
        return collect()


@ratelimit_exempt
def metrics_view(request):
    """Serve the metrics in the Prometheus text format (404 when disabled, 403 if not allowed)."""
    if not get_config()["PROMETHEUS_ENABLED"]:
        raise Http404("The Prometheus endpoint is disabled (RATELIMIT_APP['PROMETHEUS_ENABLED']).")
    if not _authorised(request):
        return HttpResponse("Forbidden: send the Prometheus bearer token.", status=403,
                            content_type="text/plain")
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
