"""``QuotaThrottle``: the DRF adapter (the only module that imports rest_framework)."""

from rest_framework.throttling import BaseThrottle

from .conf import ensure_installed

ensure_installed("ratelimit_app.throttling.QuotaThrottle")

from .guard import decide  # noqa: E402  (needs the app's models)

__all__ = ["QuotaThrottle"]


class QuotaThrottle(BaseThrottle):
    """Check the request against every quota that applies, in one Redis call.

    Usable in ``DEFAULT_THROTTLE_CLASSES`` and per-view ``throttle_classes``. DRF builds a new
    instance per request, so construction does nothing.
    """

    decision = None

    def allow_request(self, request, view):
        """Return True if the request should be allowed (it is charged at most once)."""
        self.decision = decide(request._request, request.user)
        return self.decision.allowed

    def wait(self):
        """Return the seconds the client should wait before retrying (DRF's Retry-After)."""
        return self.decision.retry_after_s if self.decision is not None else None
