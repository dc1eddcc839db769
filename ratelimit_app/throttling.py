"""``QuotaThrottle``: the DRF adapter (the only module that imports rest_framework)."""

from rest_framework.exceptions import Throttled
from rest_framework.throttling import BaseThrottle

from .conf import ensure_installed

ensure_installed("ratelimit_app.throttling.QuotaThrottle")

# (imported after the check above: they need the app's models)
from .decision.headers import (  # noqa: E402
    apply_headers,
    problem_body,
    retry_after_s,
    uncharged_preflight,
)
from .runtime.guard import HEADERS_ON_THE_WAY_OUT_ATTR, decide  # noqa: E402

__all__ = ["QuotaThrottle", "QuotaThrottled"]


class QuotaThrottled(Throttled):
    """DRF's ``Throttled`` for a request the quotas refuse, carrying the problem fields.

    ``detail`` is the problem body (a dict, so DRF's exception handler returns it as
    ``response.data``), ``wait`` the Retry-After seconds (None when the request costs more than a
    policy can ever hold) and ``decision`` the limiter's Decision.
    """

    def __init__(self, decision):
        super().__init__(wait=retry_after_s(decision))
        self.decision = decision
        # set after __init__, which would turn every value into a string ("status": "429")
        self.detail = problem_body(decision)
        # 429, or 402 when credits ran out (DRF's exception handler answers with this status)
        self.status_code = self.detail["status"]

    def get_codes(self):
        return self.default_code

    def get_full_details(self):
        return {"message": self.detail["detail"], "code": self.default_code}


class QuotaThrottle(BaseThrottle):
    """Check the request against every quota that applies, in one Redis call.

    Usable in ``DEFAULT_THROTTLE_CLASSES`` and per-view ``throttle_classes``. DRF builds a new
    instance per request, so construction does nothing.
    """

    decision = None
    is_quota_throttle = True  # how QuotaMiddleware recognises the views it leaves to us

    def allow_request(self, request, view):
        """Return True if the request should be allowed (it is charged at most once).

        A refused request raises :class:`QuotaThrottled` instead of returning False, so the
        project's exception handler receives the problem fields (DRF's ``throttled()`` would
        raise a bare ``Throttled``). The rate-limit headers go on DRF's response, refused or
        not: QuotaMiddleware sets them, or else DRF, through the view's ``headers``.
        """
        django_request = request._request
        if uncharged_preflight(django_request):
            return True
        self.decision = decision = decide(django_request, request.user)
        headers = getattr(view, "headers", None)  # set by APIView.dispatch
        if headers is not None and not hasattr(django_request, HEADERS_ON_THE_WAY_OUT_ATTR):
            apply_headers(headers, decision)
        if not decision.allowed:
            raise QuotaThrottled(decision)
        return True

    def wait(self):
        """Return the seconds the client should wait before retrying (DRF's Retry-After), or
        None: no refusal, or one that waiting cannot cure."""
        if self.decision is None or self.decision.allowed:
            return None
        return retry_after_s(self.decision)
