"""The one entry point both adapters use: decide a request once, and never fail it.

A request seen by the middleware and by the DRF throttle is charged once: the decision is kept on
the Django ``HttpRequest`` as ``request.ratelimit`` and reused.
"""

import logging

from . import engine, metrics
from .engine import Decision

__all__ = ["DECISION_ATTR", "decide", "endpoint_name"]

logger = logging.getLogger("ratelimit_app")

DECISION_ATTR = "ratelimit"


def endpoint_name(request):
    """Return the URL name of the view serving ``request`` (namespaced), or "" if unresolved."""
    match = getattr(request, "resolver_match", None)
    return match.view_name if match is not None else ""


def decide(request, user):
    """Return the Decision for ``request`` (a Django HttpRequest), computing it at most once."""
    decision = getattr(request, DECISION_ATTR, None)
    if decision is not None:
        return decision
    try:
        decision = engine.check_request(request, user, endpoint_name(request))
    except Exception:  # the limiter must never be the reason for a 500
        logger.exception("ratelimit_app: unexpected error; request allowed")
        decision = Decision(allowed=True, degraded="error")
    setattr(request, DECISION_ATTR, decision)
    metrics.record_decision(decision)
    return decision
