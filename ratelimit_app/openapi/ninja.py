"""Django Ninja: a NinjaAPI mixin whose OpenAPI schema (``/openapi.json``, shown by ``/docs``)
documents the limits of every operation the limiter decides (``openapi.limits`` says what it
adds)::

    class API(RateLimitedOpenAPI, NinjaAPI):
        pass

    api = API(throttle=QuotaThrottle())

An operation is limited when its throttles include ``ratelimit_app.ninja.QuotaThrottle``, or
when QuotaMiddleware decides it (installed, and the path not exempt). Nothing here imports
Ninja.
"""

import logging

from django.urls import get_resolver

from ..conf import quota_middleware_installed
from ..config.endpoints import list_endpoints
from ..config.ninja_operations import operation_names, quota_throttled
from ..runtime.limiter import default_limiter
from .limits import (
    add_components,
    document_operation,
    operation_limits,
    route_key,
    schema_plans,
)

__all__ = ["RateLimitedOpenAPI", "add_rate_limits"]

logger = logging.getLogger("ratelimit_app")


class RateLimitedOpenAPI:
    """Mix into a NinjaAPI subclass (before NinjaAPI) to document the limits in its schema."""

    def get_openapi_schema(self, *args, **kwargs):
        return add_rate_limits(self, super().get_openapi_schema(*args, **kwargs))


def add_rate_limits(api, schema):
    """Return ``schema`` (``api``'s OpenAPI schema) with each limited operation's 429 (and 402)
    responses, rate-limit headers and costs per plan."""
    try:
        snapshot = default_limiter().snapshot()
    except Exception:  # the schema is still served, without the limits
        logger.exception("ratelimit_app: no policy snapshot for the OpenAPI schema")
        return schema
    endpoints = {endpoint.name: endpoint for endpoint in list_endpoints()}
    plans = schema_plans(snapshot)
    paths = schema.get("paths") or {}
    middleware = quota_middleware_installed()
    documented = False
    for path_view, names in operation_names(get_resolver()).items():
        for operation, name in zip(path_view.operations, names):
            endpoint = endpoints.get(name)
            if getattr(operation, "api", None) is not api or endpoint is None or \
                    endpoint.exempt or not (middleware or quota_throttled(operation)):
                continue
            path_item = paths.get(route_key(endpoint.route)) or {}
            for method in operation.methods:
                documented_operation = path_item.get(method.lower())
                if documented_operation is not None:
                    document_operation(documented_operation,
                                       operation_limits(snapshot, name, method, plans))
                    documented = True
    return add_components(schema) if documented else schema
