"""``QuotaMiddleware``: limits plain Django views and puts the rate-limit headers on responses.

It decides in ``process_view`` (the URL is resolved by then, so the endpoint is known) and adds
``RateLimit-Policy`` / ``RateLimit`` to every limited response on the way out. DRF views are left
to ``QuotaThrottle`` unless ``MIDDLEWARE_INCLUDES_DRF`` is set, because DRF authenticates (tokens,
keys) inside the view; the throttle's refusals are DRF responses (the project's exception
handler, its renderers), and this middleware adds the headers of the throttle's decision to
them as to any other response (without it, the throttle hands them to DRF). Django Ninja
operations throttled by ``ratelimit_app.ninja.QuotaThrottle`` are left to it for the same
reason, and this middleware puts the headers on their responses (Ninja gives a throttle no
response to set them on). CORS preflights are not charged unless ``CHARGE_PREFLIGHT`` is set.

Sync and async (Django's ``sync_capable``/``async_capable``). Under an ASGI server, with every
middleware below it async-capable, it runs in async mode: ``__call__`` and ``process_view`` are
coroutine functions, so Django awaits them on the event loop (it adapts ``process_view`` to the
handler's mode, and leaves a coroutine function alone), and the decision's one Redis call is
awaited on an asyncio client (``Limiter.adecide``) instead of holding a thread. The steps are
the sync path's, in the same order.
"""

import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

from .conf import ensure_installed, get_config

ensure_installed("ratelimit_app.middleware.QuotaMiddleware")

# (imported after the check above: they need the app's models)
from .config.endpoints import unlimited_paths  # noqa: E402
from .config.ninja_operations import (  # noqa: E402
    exempt_operation,
    operation_of,
    quota_throttled,
)
from .decision.headers import (  # noqa: E402
    apply_headers_unless_set,
    problem_response,
    uncharged_preflight,
)
from .runtime.guard import (  # noqa: E402
    DECISION_ATTR,
    HEADERS_ON_THE_WAY_OUT_ATTR,
    acharge_failed_authentication,
    acheck_failed_authentication,
    adecide,
    authentication_failed,
    charge_failed_authentication,
    check_failed_authentication,
    count_response,
    decide,
    finish_after_response,
    finish_now,
)
from .runtime.limiter import default_limiter  # noqa: E402

__all__ = ["QuotaMiddleware"]

logger = logging.getLogger("ratelimit_app")


def _is_drf_view(view_func):
    # DRF's as_view() marks the function with the view class; no DRF import needed.
    view_class = getattr(view_func, "cls", None)
    return view_class is not None and hasattr(view_class, "throttle_classes")


def _limited_by(request, view_func):
    """Return what limits this request: "middleware", "throttle" (a DRF view left to its
    throttles), "ninja" (a Ninja operation with QuotaThrottle, left to its throttles) or None
    (an exempt path or the admin's, an exempt view or Ninja operation, or a preflight that is
    not charged)."""
    if unlimited_paths().matches(request.path_info) or \
            getattr(view_func, "ratelimit_exempt", False) or uncharged_preflight(request):
        return None
    if _is_drf_view(view_func):
        return "middleware" if get_config()["MIDDLEWARE_INCLUDES_DRF"] else "throttle"
    operation = operation_of(view_func, request.method)
    if operation is not None:
        if exempt_operation(operation):  # (Ninja serves every operation through one view)
            return None
        if quota_throttled(operation):  # its throttles run after Ninja's authentication
            return "ninja"
    return "middleware"


def _quota_throttle_never_ran(request):
    """True for a DRF view limited by QuotaThrottle whose request DRF refused before its
    throttles ran."""
    match = getattr(request, "resolver_match", None)
    if match is None or _limited_by(request, match.func) != "throttle":
        return False
    return any(getattr(throttle, "is_quota_throttle", False)
               for throttle in match.func.cls.throttle_classes)


def _late_decision_needed(request, response):
    """True when a limited request was not decided on its way in: DRF's content negotiation
    failed before the throttle ran (e.g. a client accepting only application/problem+json), or
    the request never reached this middleware's process_view (an unresolved URL such as
    ``/HELLO/``, or a middleware above refused it, as CSRF's 403). The middleware decides then,
    so the request is charged, carries the RateLimit headers, and a limited client hears 429.
    (Only requests without a decision get here: a limited request's costs nothing more.)"""
    if response.status_code == 406 and _quota_throttle_never_ran(request):
        return True
    if getattr(request, HEADERS_ON_THE_WAY_OUT_ATTR, False):
        return False  # process_view left it to QuotaThrottle
    match = getattr(request, "resolver_match", None)
    if match is None:  # no view: charged on the rules of every endpoint, unless exempt
        return not (unlimited_paths().matches(request.path_info) or
                    uncharged_preflight(request))
    # process_view would have decided it (or left it to the throttle) had it run
    return _limited_by(request, match.func) is not None


def _async_ninja_operation(request, view_func):
    """Return the async Django Ninja operation serving ``request``, or None."""
    operation = operation_of(view_func, request.method)
    return operation if getattr(operation, "is_async", False) else None


def _ready_for_ninja_loop(request, view_func):
    """Before an async Ninja operation, whose QuotaThrottle decides on the event loop (Ninja
    calls throttles synchronously), load what it cannot load there: rules due for a reload,
    and the session's user (the caller of an operation without ``auth``)."""
    if _async_ninja_operation(request, view_func) is None:
        return
    try:
        default_limiter().snapshot()
        user = request.__dict__.get("user")
        if user is not None:
            _loaded(user)
    except Exception:  # the throttle loads them itself then, in a thread of its own
        logger.exception("ratelimit_app: could not prepare a Ninja operation's decision")


async def _aready_for_ninja_loop(request, view_func):
    """``_ready_for_ninja_loop`` on the event loop (the database work in a thread)."""
    if _async_ninja_operation(request, view_func) is None:
        return
    try:
        await default_limiter().asnapshot()
        user = request.__dict__.get("user")
        if user is not None:
            await sync_to_async(_loaded)(user)
    except Exception:
        logger.exception("ratelimit_app: could not prepare a Ninja operation's decision")


def _has_user(request):
    """True if ``request`` may have a user to load (else its user is None, known without a
    coroutine)."""
    return hasattr(request, "auser") or getattr(request, "user", None) is not None


async def _auser(request):
    """The request's user, loaded without touching the ORM on the event loop."""
    if hasattr(request, "auser"):  # AuthenticationMiddleware's async accessor
        return await request.auser()
    user = getattr(request, "user", None)
    if user is None:
        return None
    # a lazy user (another authentication middleware) is loaded in a thread, as Django does
    return await sync_to_async(_loaded)(user)


def _loaded(user):
    getattr(user, "is_authenticated", None)  # evaluates a lazy object (its query)
    return user


def _start_watching():
    """Have this process watch the config from now, when a server loads its handler, rather
    than from its first limited request: an edit made outside the app while the worker is idle
    is then noticed and recorded too (a failure here is logged; the first request tries
    again)."""
    try:
        default_limiter().start_watching()
    except Exception:
        logger.exception("ratelimit_app: could not start watching the quota configuration")


class QuotaMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        _start_watching()
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)
            # Django adapts process_view to the handler's mode, not the middleware's: as a
            # coroutine function it is awaited on the loop instead of run in a thread
            self.process_view = self._aprocess_view

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        try:
            response = self._respond(request)
        except BaseException:
            finish_now(request)  # a slot is released, a cost settled, on exceptions too
            raise
        count_response(request, response)  # if a rule counts responses (a ban rule, …)
        return finish_after_response(request, response)  # ... and when the response is finished

    def _respond(self, request):
        # a failed authentication is known only now; over the client IP's allowance it turns
        # the response into a 429 (and becomes the request's decision)
        response = charge_failed_authentication(request, self.get_response(request))
        decision = getattr(request, DECISION_ATTR, None)
        if decision is None:
            if not _late_decision_needed(request, response):
                return response
            decision = decide(request, getattr(request, "user", None))
            if not decision.allowed:
                return problem_response(decision)
        return apply_headers_unless_set(response, decision)

    async def __acall__(self, request):
        # _respond's steps written out here: a coroutine less per request on the event loop
        try:
            response = await self.get_response(request)
            # a failed authentication is rare: the common answer awaits nothing
            if authentication_failed(request, response):
                response = await acharge_failed_authentication(request, response)
            decision = getattr(request, DECISION_ATTR, None)
            if decision is not None:
                response = apply_headers_unless_set(response, decision)
            elif _late_decision_needed(request, response):
                decision = await adecide(request, await _auser(request) if _has_user(request)
                                         else None)
                response = apply_headers_unless_set(response, decision) if decision.allowed \
                    else problem_response(decision)
        except BaseException:
            await sync_to_async(finish_now, thread_sensitive=False)(request)
            raise
        # (a ban writes to the database: in a thread)
        if default_limiter().protection.counts_responses():
            await sync_to_async(count_response)(request, response)
        return finish_after_response(request, response)

    def process_view(self, request, view_func, view_args, view_kwargs):
        limited_by = _limited_by(request, view_func)
        if limited_by != "middleware":
            if limited_by is None:
                # an exempt path such as the admin's login form: no quota, but a client IP out
                # of failed authentications may not try credentials there either
                return check_failed_authentication(request) if request.method == "POST" \
                    else None
            # QuotaThrottle decides (a DRF view's or a Ninja operation's); this middleware
            # sets the headers of its decision on the response (headers.apply_headers_unless_set)
            setattr(request, HEADERS_ON_THE_WAY_OUT_ATTR, True)
            if limited_by == "ninja":  # (a DRF view's request, the common one, skips this)
                _ready_for_ninja_loop(request, view_func)
            return None
        decision = decide(request, getattr(request, "user", None))
        if not decision.allowed:
            return problem_response(decision)
        return None

    async def _aprocess_view(self, request, view_func, view_args, view_kwargs):
        limited_by = _limited_by(request, view_func)
        if limited_by != "middleware":
            if limited_by is None:
                return await acheck_failed_authentication(request) \
                    if request.method == "POST" else None
            setattr(request, HEADERS_ON_THE_WAY_OUT_ATTR, True)  # (as process_view)
            if limited_by == "ninja":
                await _aready_for_ninja_loop(request, view_func)
            return None
        decision = await adecide(request, await _auser(request) if _has_user(request) else None)
        if not decision.allowed:
            return problem_response(decision)
        return None
