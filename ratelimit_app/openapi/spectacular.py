"""drf-spectacular: a postprocessing hook that documents the limits of every DRF operation the
limiter decides (``openapi.limits`` says what it adds).

    SPECTACULAR_SETTINGS = {"POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",   # drf-spectacular's default, kept
        "ratelimit_app.openapi.spectacular.add_rate_limits",
    ]}

A hook, rather than an AutoSchema subclass, leaves the project's own schema class alone, and
sees every operation at once. Nothing here imports drf-spectacular.
"""

import logging

from ..conf import get_config, quota_middleware_installed
from ..config.endpoints import list_endpoints
from ..runtime.limiter import default_limiter
from .limits import (
    PROBLEM_CONTENT_TYPE,
    add_components,
    document_operation,
    operation_limits,
    route_key,
    schema_plans,
)

__all__ = ["add_rate_limits", "refusal_media_types"]

logger = logging.getLogger("ratelimit_app")


def add_rate_limits(result, generator, request, public):
    """Return ``result`` (the schema drf-spectacular generated) with each limited operation's
    429 (and 402) responses, rate-limit headers and costs per plan (a POSTPROCESSING_HOOKS
    entry)."""
    try:
        snapshot = default_limiter().snapshot()
    except Exception:  # the schema is still served, without the limits
        logger.exception("ratelimit_app: no policy snapshot for the OpenAPI schema")
        return result
    endpoints = {route_key(endpoint.route): endpoint for endpoint in list_endpoints()}
    plans = schema_plans(snapshot)
    paths = result.get("paths") or {}
    documented = False
    for path, _path_regex, method, callback in getattr(generator, "endpoints", None) or ():
        operation = paths.get(path, {}).get(method.lower())
        endpoint = endpoints.get(route_key(path))
        if operation is None or endpoint is None or \
                not _limited(endpoint, getattr(callback, "cls", None)):
            continue
        view_class = getattr(callback, "cls", None)
        document_operation(operation, operation_limits(snapshot, endpoint.name, method, plans),
                           media_types=refusal_media_types(view_class))
        documented = True
    return add_components(result) if documented else result


def _limited(endpoint, view_class):
    """True if the limiter decides requests to this DRF view: its throttles include
    QuotaThrottle, or QuotaMiddleware decides DRF views too (MIDDLEWARE_INCLUDES_DRF)."""
    if endpoint.exempt:
        return False
    throttled = any(getattr(throttle, "is_quota_throttle", False)
                    for throttle in getattr(view_class, "throttle_classes", ()))
    return throttled or (get_config()["MIDDLEWARE_INCLUDES_DRF"] and quota_middleware_installed())


def refusal_media_types(view_class):
    """Return the media types a refusal of a request to this DRF view is served as:
    ``application/problem+json`` when QuotaMiddleware answers it (it decides DRF views with
    MIDDLEWARE_INCLUDES_DRF); else QuotaThrottle raises, and DRF renders the problem fields with
    the view's renderers (the browsable API's HTML left out, as drf-spectacular leaves it out)."""
    if get_config()["MIDDLEWARE_INCLUDES_DRF"] and quota_middleware_installed():
        return (PROBLEM_CONTENT_TYPE,)
    media_types = tuple(dict.fromkeys(
        renderer.media_type for renderer in getattr(view_class, "renderer_classes", ())
        if getattr(renderer, "format", "") != "api" and getattr(renderer, "media_type", "")))
    return media_types or ("application/json",)
