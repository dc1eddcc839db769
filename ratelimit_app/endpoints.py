"""The project's real endpoints, read from the URLconf, for the admin's endpoint pickers.

An endpoint is named the way the limiter sees it at request time (``guard.endpoint_name``, i.e.
``resolver_match.view_name``): the namespaced URL name such as ``api:items``, or the view's dotted
path for a URL pattern without a name. Admin URLs are left out: the middleware never limits them.
"""

import functools
import logging
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver

__all__ = ["Endpoint", "endpoint_names", "find_endpoint", "list_endpoints"]

logger = logging.getLogger("ratelimit_app")

# Methods every class-based view answers by itself; listing them would say nothing.
_IMPLICIT_METHODS = {"head", "options"}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint: ``name`` as rules and costs store it, its route and what serves it."""

    name: str
    route: str          # e.g. "/api/items/"
    view: str           # DRF view name ("Item List"), else the view's dotted path
    methods: tuple = () # HTTP methods the view implements; empty when unknown (function views)

    @property
    def label(self):
        """Return the text an operator picks: ``api:items — /api/items/ (Item List; GET)``."""
        methods = f"; {', '.join(self.methods)}" if self.methods else ""
        return f"{self.name} — {self.route} ({self.view}{methods})"


def list_endpoints(urlconf=None):
    """Return the project's endpoints (admin excluded), sorted by name, each name once."""
    return _endpoints_of(get_resolver(urlconf))


def endpoint_names(urlconf=None):
    """Return the set of endpoint names of the URLconf."""
    return {endpoint.name for endpoint in list_endpoints(urlconf)}


def find_endpoint(name, urlconf=None):
    """Return the Endpoint called ``name``, or None if the URLconf has no such endpoint."""
    return next((e for e in list_endpoints(urlconf) if e.name == name), None)


# Keyed by the resolver object: Django builds a new one when the URLconf changes (and in
# tests with override_settings(ROOT_URLCONF=...)), so a stale list is never served.
@functools.lru_cache(maxsize=8)
def _endpoints_of(resolver):
    found = {}
    for endpoint in _walk(resolver.url_patterns, namespaces=(), route_prefix="/"):
        found.setdefault(endpoint.name, endpoint)  # e.g. DRF format-suffix patterns repeat a name
    return tuple(sorted(found.values(), key=lambda e: e.name))


def _walk(patterns, namespaces, route_prefix):
    for pattern in patterns:
        route = route_prefix + _route_text(pattern)
        if isinstance(pattern, URLResolver):
            if pattern.app_name == "admin":  # any AdminSite, whatever its instance name
                continue
            inner = namespaces + (pattern.namespace,) if pattern.namespace else namespaces
            yield from _walk(pattern.url_patterns, inner, route)
        elif isinstance(pattern, URLPattern):
            yield _endpoint(pattern, namespaces, route)


def _route_text(pattern):
    text = str(pattern.pattern)
    # regex patterns (re_path) read better without their anchors
    return text.removeprefix("^").removesuffix("$").removesuffix(r"\Z")


def _endpoint(pattern, namespaces, route):
    callback = pattern.callback
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    name = ":".join(namespaces + (pattern.name or _func_path(callback),))
    return Endpoint(name=name, route=route, view=_view_label(callback, view_class),
                    methods=_methods(callback, view_class))


def _func_path(callback):
    """The dotted path Django's ResolverMatch uses as the view name of an unnamed pattern."""
    view = getattr(callback, "view_class", callback)
    if not hasattr(view, "__name__"):
        return f"{view.__class__.__module__}.{view.__class__.__name__}"
    return f"{view.__module__}.{view.__name__}"


def _view_label(callback, view_class):
    if view_class is not None and hasattr(view_class, "get_view_name"):
        try:  # DRF's own name for the view, as its browsable API shows it
            return str(view_class(**getattr(callback, "initkwargs", {})).get_view_name())
        except Exception:
            logger.debug("ratelimit_app: no DRF name for %r", view_class, exc_info=True)
    return _func_path(callback)


def _methods(callback, view_class):
    actions = getattr(callback, "actions", None)  # DRF viewsets: {"get": "list", ...}
    if actions:
        return tuple(m.upper() for m in actions if m not in _IMPLICIT_METHODS)
    if view_class is None:
        return ()
    return tuple(m.upper() for m in view_class.http_method_names
                 if m not in _IMPLICIT_METHODS and hasattr(view_class, m))
