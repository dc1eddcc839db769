"""The project's real endpoints, read from the URLconf, for the admin's endpoint pickers.

An endpoint is named the way the limiter sees it at request time (``guard.endpoint_name``, i.e.
``resolver_match.view_name``): the namespaced URL name such as ``api:items``, or the view's dotted
path for a URL pattern without a name. A Django Ninja operation is an endpoint of its own, named
by its URL name (``api-1.0.0:create_item``, see ``ninja_operations.py``), with its methods. Admin URLs are left out: the middleware never limits them.
Routes read as Django routes: a regex pattern's named groups (a DRF router's ``(?P<pk>[^/.]+)``)
show as ``<pk>``, without anchors.

An endpoint is *exempt* when no request to it is ever charged: QuotaMiddleware skips it (its
route lies under an ``EXEMPT_PATHS`` entry, or its view is marked ``@ratelimit_exempt``) and it
is not a DRF view that QuotaThrottle limits anyway (the throttle knows neither). A Django Ninja
operation marked ``@ratelimit_exempt`` is exempt whatever its throttles: Ninja's QuotaThrottle
honours the mark too. The pickers do
not offer exempt endpoints: a rule or cost on one would never apply.
"""

import functools
import logging
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RegexPattern
from django.utils.regex_helper import normalize

from ..conf import ExemptPaths, exempt_paths, get_config
from .ninja_operations import exempt_operation, path_view_of, quota_throttled

__all__ = ["Endpoint", "endpoint_names", "find_endpoint", "limited_endpoints", "list_endpoints",
           "scoped_endpoints", "unlimited_paths", "admin_roots", "forget_unlimited_paths"]

logger = logging.getLogger("ratelimit_app")

# Methods every class-based view answers by itself; listing them would say nothing.
_IMPLICIT_METHODS = {"head", "options"}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint: ``name`` as rules and costs store it, its route and what serves it."""

    name: str
    route: str          # e.g. "/api/items/", "/api/items/<pk>/"
    view: str           # DRF view name ("Item List"), else the view's dotted path
    methods: tuple = () # HTTP methods the view implements; empty when unknown (function views)
    exempt: bool = False  # never charged (see the module docstring)
    throttle_scope: str = ""  # a DRF view's ``throttle_scope`` (DRF's ScopedRateThrottle)

    @property
    def label(self):
        """Return the text an operator picks: ``api:item-list — GET, POST /api/items/ (Item
        List)``, or ``hello — /hello/ (project.views.hello)`` when the methods are unknown."""
        methods = f"{', '.join(self.methods)} " if self.methods else ""
        return f"{self.name} — {methods}{self.route} ({self.view})"


def list_endpoints(urlconf=None):
    """Return the project's endpoints (admin excluded, exempt ones included), sorted by name,
    each name once."""
    return _endpoints_of(get_resolver(urlconf), exempt_paths())


def scoped_endpoints(urlconf=None):
    """Return ``(endpoint name, throttle_scope)`` of every DRF view that names a
    ``throttle_scope`` (what DRF's ScopedRateThrottle limits), exempt ones left out."""
    return [(endpoint.name, endpoint.throttle_scope) for endpoint in list_endpoints(urlconf)
            if endpoint.throttle_scope and not endpoint.exempt]


def limited_endpoints(urlconf=None):
    """Return the endpoints a rule or cost can apply to: ``list_endpoints`` less exempt ones."""
    return tuple(endpoint for endpoint in list_endpoints(urlconf) if not endpoint.exempt)


def endpoint_names(urlconf=None):
    """Return the set of endpoint names of the URLconf."""
    return {endpoint.name for endpoint in list_endpoints(urlconf)}


def find_endpoint(name, urlconf=None):
    """Return the Endpoint called ``name``, or None if the URLconf has no such endpoint."""
    return next((e for e in list_endpoints(urlconf) if e.name == name), None)


@functools.cache
def unlimited_paths():
    """Return the paths QuotaMiddleware neither limits nor counts: ``EXEMPT_PATHS`` and the admin
    site's own, wherever the URLconf mounts it (``admin_roots``), whatever EXEMPT_PATHS says: the
    staff's pages and the dashboard's polling are not API traffic, and must not show up as a hot
    caller. Built once per settings and URLconf (``forget_unlimited_paths``), so the request
    path pays the one prefix check it paid for EXEMPT_PATHS alone."""
    return ExemptPaths([*get_config()["EXEMPT_PATHS"], *admin_roots(get_resolver())])


def forget_unlimited_paths(**kwargs):
    """``setting_changed`` receiver: the settings or the URLconf that ``unlimited_paths`` was
    built from changed."""
    if kwargs.get("setting") in (None, "RATELIMIT_APP", "ROOT_URLCONF"):
        unlimited_paths.cache_clear()


def admin_roots(resolver):
    """Return the path of every admin site the URLconf of ``resolver`` mounts, as an
    ``EXEMPT_PATHS`` entry without its trailing slash (``"/admin"``: the path itself, which
    redirects to ``/admin/``, and what lies beneath it). An admin at the site's root, or under
    a route with a parameter, cannot be told apart by its path: it is left out."""
    return list(_admin_roots(resolver.url_patterns, "/"))


def _admin_roots(patterns, prefix):
    for pattern in patterns:
        if not isinstance(pattern, URLResolver):
            continue
        text = _route_text(pattern.pattern)
        if "<" in text:
            continue
        if pattern.app_name == "admin":  # any AdminSite, whatever its instance name
            root = (prefix + text).rstrip("/")
            if root:
                yield root
        else:
            yield from _admin_roots(pattern.url_patterns, prefix + text)


# Keyed by the resolver object: Django builds a new one when the URLconf changes (and in
# tests with override_settings(ROOT_URLCONF=...)), so a stale list is never served.
@functools.lru_cache(maxsize=8)
def _endpoints_of(resolver, exempt):
    found = {}
    for endpoint in _walk(resolver.url_patterns, (), "/", "/", exempt, {}):
        found.setdefault(endpoint.name, endpoint)  # e.g. DRF format-suffix patterns repeat a name
    return tuple(sorted(found.values(), key=lambda e: e.name))


def _walk(patterns, namespaces, route_prefix, literal_prefix, exempt, ninja_seen):
    # literal_prefix: the start every path of the route shares (up to its first parameter),
    # which is what EXEMPT_PATHS is compared with; ninja_seen: how many patterns
    # of each Ninja path view came before (its n-th pattern is its n-th operation's)
    for pattern in patterns:
        text = _route_text(pattern.pattern)
        route = route_prefix + text
        literal = literal_prefix + text.split("<", 1)[0] if literal_prefix == route_prefix \
            else literal_prefix
        if isinstance(pattern, URLResolver):
            if pattern.app_name == "admin":  # any AdminSite, whatever its instance name
                continue
            inner = namespaces + (pattern.namespace,) if pattern.namespace else namespaces
            yield from _walk(pattern.url_patterns, inner, route, literal, exempt,
                             ninja_seen)
        elif isinstance(pattern, URLPattern):
            under_exempt_path = exempt.matches(literal)
            path_view = path_view_of(pattern.callback)
            if path_view is None:
                yield _endpoint(pattern, namespaces, route, under_exempt_path)
                continue
            index = ninja_seen.get(path_view, 0)
            ninja_seen[path_view] = index + 1
            if index < len(path_view.operations):
                yield _ninja_endpoint(pattern, namespaces, route, under_exempt_path,
                                      path_view.operations[index])


def _route_text(pattern):
    """Return a URL pattern as a route: ``items/<int:pk>/`` as written, a regex pattern with
    its named groups as ``<name>`` and no anchors (the regex itself when it has parts a route
    cannot show, such as alternatives)."""
    if not isinstance(pattern, RegexPattern):
        return str(pattern)
    regex = pattern.regex.pattern
    raw = regex.removeprefix("^").removesuffix("$").removesuffix(r"\Z")
    try:
        # Django's reverse() reads a regex the same way: a format string and its parameters
        text, params = normalize(regex)[0]
        route = text % {param: f"<{param}>" for param in params}
    except (IndexError, KeyError, TypeError, ValueError):
        return raw
    return route if route or not raw else raw


def _endpoint(pattern, namespaces, route, under_exempt_path):
    callback = pattern.callback
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    name = ":".join(namespaces + (pattern.name or _func_path(callback),))
    skipped_by_middleware = under_exempt_path or getattr(callback, "ratelimit_exempt", False)
    return Endpoint(name=name, route=route, view=_view_label(callback, view_class),
                    methods=_methods(callback, view_class),
                    exempt=skipped_by_middleware and not _quota_throttled(view_class),
                    throttle_scope=_throttle_scope(view_class))


def _ninja_endpoint(pattern, namespaces, route, under_exempt_path, operation):
    """The Endpoint of one Django Ninja operation (each has a URL pattern of its own)."""
    view_func = operation.view_func
    return Endpoint(name=":".join(namespaces + (pattern.name or "",)), route=route,
                    view=f"{view_func.__module__}.{view_func.__qualname__}",
                    methods=tuple(operation.methods),
                    exempt=exempt_operation(operation) or
                    (under_exempt_path and not quota_throttled(operation)))


def _quota_throttled(view_class):
    """True for a DRF view whose throttles include QuotaThrottle (or a subclass)."""
    return any(getattr(throttle, "is_quota_throttle", False)
               for throttle in getattr(view_class, "throttle_classes", ()))


def _throttle_scope(view_class):
    scope = getattr(view_class, "throttle_scope", None)
    return scope if isinstance(scope, str) else ""


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
