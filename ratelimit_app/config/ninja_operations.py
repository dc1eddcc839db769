"""Django Ninja's operations as the limiter sees them, read without importing Ninja.

Ninja serves every path of an API through one ``PathView`` that holds the path's operations (a
GET ``list_items`` and a POST ``create_item`` on ``/items``, say) and gives each operation a URL
pattern of its own, named after it (``api-1.0.0:create_item``), all with the same route and the
same view. Django resolves a request to the first of those patterns, whatever its method, so
``resolver_match.view_name`` names the path's first operation. The limiter names the operation
that serves the request instead (the first one whose methods include the request's, as Ninja
chooses it): endpoint costs and rules name Ninja operations as they name URL names and DRF views,
and the admin offers one endpoint per operation (``endpoints.py``).

A Ninja URL pattern's view is the path view's bound method (older releases, such as 1.2) or a
function closing over it (newer ones, such as 1.7); both are recognised by the ``PathView`` they
lead to.
"""

import functools
from types import FunctionType, MethodType

from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver

__all__ = ["path_view_of", "serving_operation", "operation_of", "requested_operation",
           "quota_throttled", "exempt_operation", "operation_endpoint", "operation_names",
           "sent_key_credentials"]


def _path_view_behind(callback):
    """Return the Ninja ``PathView`` behind a URL pattern's view ``callback``, or None for any
    other view (what ``path_view_of`` remembers)."""
    # by the callback's type, not getattr with a default: a missing attribute raises inside,
    # which would cost every request to every other view
    kind = type(callback)
    if kind is MethodType:  # older Ninja: the path view's bound method
        owner = callback.__self__
    elif kind is FunctionType and "self" in callback.__code__.co_freevars:
        owner = callback.__closure__[callback.__code__.co_freevars.index("self")].cell_contents
    else:
        return None  # (nearly every view: a plain function or a class-based view's)
    owner_kind = type(owner)
    if owner_kind.__name__ != "PathView" or not owner_kind.__module__.startswith("ninja"):
        return None
    return owner


class _PathViews(dict):
    """``{callback: its PathView or None}``, filled on first sight (``__missing__``), so that
    ``path_view_of`` on a callback seen before is one dict lookup in C, with no Python call:
    every request asks, twice (a function's ``__code__.co_freevars`` is a new tuple at each
    read). Its keys are URL patterns' callbacks (the URLconfs' views, never request input;
    hashable, as Django's reverse lookups key on them too), and it is emptied at MAX_CALLBACKS
    all the same (URLconfs rebuilt again and again, as tests
    do, would otherwise keep every old one)."""

    MAX_CALLBACKS = 4096

    def __missing__(self, callback):
        if len(self) >= self.MAX_CALLBACKS:
            self.clear()
        path_view = self[callback] = _path_view_behind(callback)
        return path_view


# Return the Ninja ``PathView`` behind a URL pattern's view ``callback``, or None for any other
# view. (A bound dict method, not a function: see _PathViews.)
path_view_of = _PathViews().__getitem__


def serving_operation(path_view, method):
    """Return the operation of ``path_view`` that serves ``method`` (as Ninja chooses it), or
    None (Ninja answers 405)."""
    for operation in path_view.operations:
        if method in operation.methods:
            return operation
    return None


def operation_of(callback, method):
    """Return the Ninja operation that serves ``method`` behind a URL pattern's view
    ``callback``, or None (another view, or a method the path does not serve)."""
    path_view = path_view_of(callback)
    return serving_operation(path_view, method) if path_view is not None else None


def requested_operation(request):
    """Return the Ninja operation serving ``request`` (resolved already), or None."""
    match = getattr(request, "resolver_match", None)
    return operation_of(match.func, request.method) if match is not None else None


def exempt_operation(operation):
    """True if the Ninja ``operation``'s function is marked ``@ratelimit_exempt`` (read at
    request time, so the decorator may sit above or below Ninja's ``@api.get``)."""
    return getattr(operation.view_func, "ratelimit_exempt", False) is True


def quota_throttled(operation):
    """True if the Ninja ``operation``'s throttles include QuotaThrottle (Ninja gives an
    operation its router's or API's throttles when it has none of its own)."""
    return any(getattr(throttle, "is_quota_throttle", False)
               for throttle in operation.throttle_objects)


def sent_key_credentials(request):
    """True if ``request`` goes to a Ninja operation whose ``auth`` reads a key (an
    ``APIKeyHeader``, ``APIKeyQuery`` or ``APIKeyCookie``) and it sent one: a 401 then means the
    key was wrong (a session cookie is not such a key: a signed-out session sends one too)."""
    operation = requested_operation(request)
    if operation is None:
        return False
    places = {"header": request.headers, "query": request.GET, "cookie": request.COOKIES}
    for auth in operation.auth_callbacks:
        place, name = getattr(auth, "openapi_in", None), getattr(auth, "param_name", None)
        if place not in places or not isinstance(name, str):
            continue
        if place == "cookie" and name == settings.SESSION_COOKIE_NAME:
            continue
        if places[place].get(name):
            return True
    return False


def operation_endpoint(request, path_view, operation):
    """Return the endpoint name of ``operation`` of ``path_view`` serving ``request``: its
    namespaced URL name (the resolved name when the URLconf does not list it)."""
    match = request.resolver_match
    names = operation_names(get_resolver(getattr(request, "urlconf", None))).get(path_view)
    index = path_view.operations.index(operation)
    if names is None or index >= len(names):
        return match.view_name
    return names[index]


# Keyed by the resolver object, as endpoints._endpoints_of is: a new URLconf, a new map.
@functools.lru_cache(maxsize=8)
def operation_names(resolver):
    """Return ``{path view: (namespaced URL name of each of its operations, in order)}`` for
    the Ninja APIs of ``resolver``'s URLconf."""
    found = {}
    _collect(resolver.url_patterns, (), found)
    return {path_view: tuple(names) for path_view, names in found.items()}


def _collect(patterns, namespaces, found):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = namespaces + (pattern.namespace,) if pattern.namespace else namespaces
            _collect(pattern.url_patterns, inner, found)
        elif isinstance(pattern, URLPattern):
            path_view = path_view_of(pattern.callback)
            if path_view is not None:
                found.setdefault(path_view, []).append(":".join(namespaces + (pattern.name or "",)))
