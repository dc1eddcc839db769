"""The Django Ninja adapter: ``QuotaThrottle`` for ``NinjaAPI(throttle=...)``, routers and
operations, and ``add_refusal_handler`` for the refusals' answer. The only module that imports
``ninja``.

Each request is decided as everywhere else (``runtime.guard.decide``, once per request: a
request QuotaMiddleware decided is not charged again), after Ninja's authentication, so the
caller is who Ninja's ``auth`` says (``SessionAuth``/``django_auth``, an ``APIKeyHeader`` or
``HttpBearer`` whose ``authenticate`` returns a user, or an object with a ``user``), as DRF's
authenticated user is for the DRF throttle. QuotaMiddleware leaves these operations to the
throttle and puts the RateLimit headers on their responses.

Ninja calls a throttle's ``allow_request`` without awaiting it, on async operations too: there
the decision's one Redis call is made on the event loop (as Ninja's own throttles make their
cache calls), bounded by the store's socket timeout and the breaker; whatever could need the
database (rules to reload, a caller still to load) is done in a worker thread instead, which the
loop waits for.
"""

import asyncio
import concurrent.futures
import threading

from django.utils.functional import LazyObject, empty
from ninja.errors import Throttled
from ninja.throttling import BaseThrottle

from .conf import ensure_installed

ensure_installed("ratelimit_app.ninja.QuotaThrottle")

# (imported after the check above: they need the app's models)
from .config.ninja_operations import exempt_operation, requested_operation  # noqa: E402
from .decision.headers import (  # noqa: E402
    apply_headers,
    problem_body,
    retry_after_s,
    uncharged_preflight,
)
from .runtime.guard import DECISION_ATTR, decide  # noqa: E402
from .runtime.limiter import default_limiter  # noqa: E402

__all__ = ["QuotaThrottle", "add_refusal_handler", "refusal_response"]

PROBLEM_CONTENT_TYPE = "application/problem+json"


class QuotaThrottle(BaseThrottle):
    """Check the request against every quota that applies, in one Redis call.

    Usable as ``NinjaAPI(throttle=QuotaThrottle())``, ``Router(throttle=...)``,
    ``api.add_router(..., throttle=...)`` and per operation (``@api.get(..., throttle=...)``).
    Ninja keeps one instance for every request of every thread, so the instance holds no
    request's state but the refusal ``wait()`` is asked about, right after ``allow_request``
    in the same thread.
    """

    is_quota_throttle = True  # how QuotaMiddleware recognises the operations it leaves to us

    def __init__(self):
        self._refused = threading.local()
        self._worker = None  # a thread for async operations' database work, made when needed
        self._worker_lock = threading.Lock()

    def allow_request(self, request):
        """Return True if the request should be allowed (it is charged at most once).

        A refused request returns False; Ninja then raises ``Throttled`` with ``wait()``'s
        seconds into the API's exception handlers (see ``add_refusal_handler``). An operation
        marked ``@ratelimit_exempt`` is allowed without a decision (no charge, no Redis call).
        """
        if uncharged_preflight(request) or _exempt(request):
            return True
        if _on_event_loop():
            decision = self._decide_on_loop(request)
        else:
            decision = decide(request, self.caller(request))
        self._refused.decision = None if decision.allowed else decision
        return decision.allowed

    def wait(self):
        """Return the seconds the client should wait before retrying (Retry-After), or None:
        no refusal, or one that waiting cannot cure."""
        decision = getattr(self._refused, "decision", None)
        return None if decision is None else retry_after_s(decision)

    def caller(self, request):
        """Return the user ``request`` is limited as (None: anonymous, or its API key alone).

        Ninja's ``request.auth`` (what the operation's ``auth`` returned) when it is a signed-in
        user or has one as ``.user``; else the session's user (AuthenticationMiddleware).
        Override it for an ``auth`` that returns something else (a token string, say).
        """
        auth = getattr(request, "auth", None)
        for candidate in (auth, getattr(auth, "user", None)):
            if _is_signed_in_user(candidate):
                return candidate
        return getattr(request, "user", None)

    def _decide_on_loop(self, request):
        """``decide`` for an async operation, called on the event loop: directly when neither
        the rules nor the caller need the database, else in the worker thread."""
        auth = getattr(request, "auth", None)
        if default_limiter().policies.current() is not None and (
                _is_signed_in_user(auth) or (auth is None and _loaded_or_absent(request))):
            return decide(request, self.caller(request))
        return self._in_worker(lambda: decide(request, self.caller(request)))

    def _in_worker(self, work):
        with self._worker_lock:
            if self._worker is None:
                # one thread, reused: its database connection is opened once
                self._worker = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="ratelimit-ninja")
        return self._worker.submit(work).result()


def add_refusal_handler(api):
    """Make ``api`` (a NinjaAPI) answer the quotas' refusals with their problem body (RFC 9457,
    ``application/problem+json``: 429, or 402 when credits ran out), ``Retry-After`` and the
    RateLimit headers; returns ``api``. Other throttles' refusals keep Ninja's own answer."""

    def answer_throttled(request, exc):
        decision = getattr(request, DECISION_ATTR, None)
        if decision is None or decision.allowed:
            # another throttle refused it: Ninja's default answer
            return api.create_response(request, {"detail": str(exc)}, status=exc.status_code)
        return refusal_response(api, request, decision)

    api.add_exception_handler(Throttled, answer_throttled)
    return api


def refusal_response(api, request, decision):
    """Return ``api``'s response to a refused ``decision``: its problem body through the API's
    renderer, as ``application/problem+json`` when that renderer writes JSON."""
    body = problem_body(decision)
    response = api.create_response(request, body, status=body["status"])
    if getattr(api.renderer, "media_type", None) == "application/json":
        response["Content-Type"] = PROBLEM_CONTENT_TYPE
    return apply_headers(response, decision)


def _exempt(request):
    operation = requested_operation(request)
    return operation is not None and exempt_operation(operation)


def _on_event_loop():
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _is_signed_in_user(candidate):
    # a user model instance (a lazy request.user is left to caller's last step)
    return (candidate is not None and not isinstance(candidate, LazyObject)
            and getattr(candidate, "is_authenticated", False) is True
            and hasattr(candidate, "get_username"))


def _loaded_or_absent(request):
    """True if reading ``request.user`` needs no query: none, or a lazy user already loaded."""
    user = request.__dict__.get("user")
    return user is None or not isinstance(user, LazyObject) or user._wrapped is not empty
