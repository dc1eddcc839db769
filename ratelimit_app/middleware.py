"""``QuotaMiddleware``: limits plain Django views and puts the rate-limit headers on responses.

It decides in ``process_view`` (the URL is resolved by then, so the endpoint is known) and adds
``RateLimit-Policy`` / ``RateLimit`` to every limited response on the way out, including
responses of DRF views limited by ``QuotaThrottle``. DRF views are left to the throttle unless
``MIDDLEWARE_INCLUDES_DRF`` is set, because DRF authenticates (tokens, keys) inside the view.
"""

from .conf import ensure_installed, get_config

ensure_installed("ratelimit_app.middleware.QuotaMiddleware")

from .guard import DECISION_ATTR, decide  # noqa: E402  (needs the app's models)
from .headers import apply_headers, problem_response  # noqa: E402

__all__ = ["QuotaMiddleware"]


def _is_drf_view(view_func):
    # DRF's as_view() marks the function with the view class; no DRF import needed.
    view_class = getattr(view_func, "cls", None)
    return view_class is not None and hasattr(view_class, "throttle_classes")


class QuotaMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        decision = getattr(request, DECISION_ATTR, None)
        if decision is None:
            return response
        if not decision.allowed and response.status_code == 429 and \
                response.get("Content-Type") != "application/problem+json":
            # DRF's Throttled response: replace it with the same problem body plain views get
            response = problem_response(decision)
        return apply_headers(response, decision)

    def process_view(self, request, view_func, view_args, view_kwargs):
        config = get_config()
        if request.path_info.startswith(tuple(config["EXEMPT_PATHS"])) or \
                getattr(view_func, "ratelimit_exempt", False):
            return None
        if _is_drf_view(view_func) and not config["MIDDLEWARE_INCLUDES_DRF"]:
            return None
        decision = decide(request, getattr(request, "user", None))
        if not decision.allowed:
            return problem_response(decision)
        return None
