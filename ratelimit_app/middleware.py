"""``QuotaMiddleware``: limits plain Django views and puts the rate-limit headers on responses.

It decides in ``process_view`` (the URL is resolved by then, so the endpoint is known) and adds
``RateLimit-Policy`` / ``RateLimit`` to every limited response on the way out. DRF views are left
to ``QuotaThrottle`` unless ``MIDDLEWARE_INCLUDES_DRF`` is set, because DRF authenticates (tokens,
keys) inside the view; the throttle's refusals are DRF responses (the project's exception
handler, its renderers) and carry the headers already. CORS preflights are not charged unless
``CHARGE_PREFLIGHT`` is set.
"""

from .conf import ensure_installed, get_config

ensure_installed("ratelimit_app.middleware.QuotaMiddleware")

from .guard import (DECISION_ATTR, charge_failed_authentication,  # noqa: E402 (needs models)
                    check_failed_authentication, decide)
from .headers import apply_headers, problem_response, uncharged_preflight  # noqa: E402

__all__ = ["QuotaMiddleware"]


def _is_drf_view(view_func):
    # DRF's as_view() marks the function with the view class; no DRF import needed.
    view_class = getattr(view_func, "cls", None)
    return view_class is not None and hasattr(view_class, "throttle_classes")


def _limited_by(request, view_func):
    """Return what limits this request: "middleware", "throttle" (a DRF view left to its
    throttles) or None (an exempt path or view, or a preflight that is not charged)."""
    config = get_config()
    if request.path_info.startswith(tuple(config["EXEMPT_PATHS"])) or \
            getattr(view_func, "ratelimit_exempt", False) or uncharged_preflight(request):
        return None
    if _is_drf_view(view_func) and not config["MIDDLEWARE_INCLUDES_DRF"]:
        return "throttle"
    return "middleware"


def _quota_throttle_never_ran(request):
    """True for a DRF view limited by QuotaThrottle whose request DRF refused before its
    throttles ran."""
    match = getattr(request, "resolver_match", None)
    if match is None or _limited_by(request, match.func) != "throttle":
        return False
    return any(getattr(throttle, "is_quota_throttle", False)
               for throttle in match.func.cls.throttle_classes)


class QuotaMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # a failed authentication is known only now; over the client IP's allowance it turns
        # the response into a 429 (and becomes the request's decision)
        response = charge_failed_authentication(request, self.get_response(request))
        decision = getattr(request, DECISION_ATTR, None)
        if decision is None:
            if response.status_code != 406 or not _quota_throttle_never_ran(request):
                return response
            # DRF's content negotiation failed before the throttle ran (e.g. a client accepting
            # only application/problem+json): decide here, so a limited client hears 429.
            decision = decide(request, getattr(request, "user", None))
            if not decision.allowed:
                return problem_response(decision)
        if not response.has_header("RateLimit-Policy"):  # QuotaThrottle set DRF's already
            apply_headers(response, decision)
        return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        limited_by = _limited_by(request, view_func)
        if limited_by is None and request.method == "POST":
            # an exempt path such as the admin's login form: no quota, but a client IP out of
            # failed authentications may not try credentials there either
            return check_failed_authentication(request)
        if limited_by != "middleware":
            return None
        decision = decide(request, getattr(request, "user", None))
        if not decision.allowed:
            return problem_response(decision)
        return None
