"""The one entry point both adapters use: decide a request once, and never fail it.

A request seen by the middleware and by the DRF throttle is charged once: the decision is kept on
the Django ``HttpRequest`` as ``request.ratelimit`` and reused.

Failed authentication (D3) is charged here too, once the response shows it: a wrong password
(Django's ``user_login_failed`` signal), a 401 answer to a request that carried credentials, or
an API key header naming no active key. Each costs the client IP one token of its failed-auth
rules; a client IP with none left is refused (429) whatever it sends, so guessing is limited and
a right guess looks like a wrong one.

The ``a``-prefixed functions are the same for an event loop (QuotaMiddleware under ASGI): they
await the Limiter's async methods and differ in nothing else.
"""

import logging

from asgiref.sync import sync_to_async

from ..conf import get_config, meta_key
from ..config.ninja_operations import (
    operation_endpoint,
    path_view_of,
    sent_key_credentials,
    serving_operation,
)
from ..decision.engine import Decision
from ..decision.headers import problem_response
from ..decision.meter import reported_header_units
from .limiter import default_limiter

__all__ = ["DECISION_ATTR", "HEADERS_ON_THE_WAY_OUT_ATTR", "decide", "adecide",
           "finish_after_response", "finish_now", "endpoint_name", "mark_authentication_failed",
           "authentication_failed", "charge_failed_authentication",
           "acharge_failed_authentication",
           "check_failed_authentication", "acheck_failed_authentication",
           "count_response"]

logger = logging.getLogger("ratelimit_app")

DECISION_ATTR = "ratelimit"
AUTH_FAILED_ATTR = "_ratelimit_authentication_failed"
# set by QuotaMiddleware on a request it leaves to QuotaThrottle: the middleware puts the
# headers on the response (directly, see headers.apply_headers), so the throttle need not hand
# them to DRF (which would set each through Django's checks)
HEADERS_ON_THE_WAY_OUT_ATTR = "_ratelimit_headers_on_the_way_out"
# every request's decision while RATELIMIT_APP["ENABLED"] is False: allowed, no policy
NOT_LIMITED = Decision(allowed=True)


def endpoint_name(request):
    """Return the URL name of the view serving ``request`` (namespaced), or "" if unresolved;
    for a Django Ninja path, the URL name of the operation serving the request's method (see
    config/ninja_operations.py)."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        return ""
    path_view = path_view_of(match.func)
    if path_view is not None:
        operation = serving_operation(path_view, request.method)
        if operation is not None:
            return operation_endpoint(request, path_view, operation)
    return match.view_name


def decide(request, user):
    """Return the Decision for ``request`` (a Django HttpRequest), computing it at most once."""
    decision = getattr(request, DECISION_ATTR, None)
    if decision is not None:
        return decision
    try:
        limiter = default_limiter()
        decision = limiter.decide(request, user, endpoint_name(request)) if limiter.enabled \
            else NOT_LIMITED
    except Exception as error:  # the limiter must never be the reason for a 500
        _unexpected(error, "deciding a request; request allowed")
        decision = Decision(allowed=True, degraded="error")
    return _keep(request, decision)


async def adecide(request, user):
    """``decide`` for an event loop."""
    decision = getattr(request, DECISION_ATTR, None)
    if decision is not None:
        return decision
    try:
        limiter = default_limiter()
        decision = await limiter.adecide(request, user, endpoint_name(request)) \
            if limiter.enabled else NOT_LIMITED
    except Exception as error:  # the limiter must never be the reason for a 500
        _unexpected(error, "deciding a request; request allowed")
        decision = Decision(allowed=True, degraded="error")
    return _keep(request, decision)


def finish_after_response(request, response):
    """Return ``response``, set to finish the request's decision when the response is
    finished: Django (and the WSGI/ASGI server) call its ``close()`` once the content is sent,
    a streaming response's content exhausted or closed, or the client gone. Finishing releases
    the concurrency slot the decision holds and settles a metered request's cost (first taking
    what its response header reported); it runs once, however often close() is called."""
    decision = getattr(request, DECISION_ATTR, None)
    if decision is None or (decision.slot is None and decision.meter is None):
        return response
    if decision.meter is not None:
        _take_reported_header(decision, response)
    finish = _Finish(decision)
    if response.streaming and getattr(response, "file_to_stream", None) is None:
        # Under ASGI, Django cancels a stream whose client left without calling close(): the
        # stream itself finishes then, as it is closed (a file keeps its sendfile path: its
        # size is known, and WSGI servers close it)
        response.streaming_content = _finishing(response, finish)
    response._resource_closers.append(finish)
    return response


def _finishing(response, finish):
    """Return ``response``'s content as an iterator of the same kind (async or not) that
    runs ``finish`` once it is exhausted or closed."""
    if response.is_async:
        return _afinishing(response.streaming_content, finish)
    return _sync_finishing(response.streaming_content, finish)


def _sync_finishing(content, finish):
    try:
        yield from content
    finally:
        finish()


async def _afinishing(content, finish):
    try:
        async for part in content:
            yield part
    finally:
        # a Redis call: in a worker thread, not on the event loop
        await sync_to_async(finish, thread_sensitive=False)()


def finish_now(request):
    """Finish ``request``'s decision now (the view raised: no response): release its slot,
    settle its cost on what it reported so far."""
    decision = getattr(request, DECISION_ATTR, None)
    if decision is not None and (decision.slot is not None or decision.meter is not None):
        _Finish(decision)()


def _take_reported_header(decision, response):
    try:
        units = reported_header_units(response)
        if units is not None:
            decision.meter.add(units)
    except Exception as error:  # the limiter must never fail a response
        _unexpected(error, "reading a metered request's reported cost; charged its estimate")


class _Finish:
    """Finish a decision after its response: release its slot, settle its meter; once."""

    def __init__(self, decision):
        self.decision = decision

    def __call__(self):
        decision, self.decision = self.decision, None
        if decision is None:
            return
        if decision.slot is not None:
            try:
                default_limiter().release_slot(decision)
            except Exception as error:  # the limiter must never fail a response
                _unexpected(error, "releasing a concurrency slot; it frees at its deadline")
        if decision.meter is not None:
            try:
                default_limiter().settle_metered(decision)
            except Exception as error:
                _unexpected(error, "settling a metered request; it stays charged its estimate")


def _unexpected(error, action):
    """Count and log ``error``, an exception that escaped the Limiter while ``action``."""
    try:
        limiter = default_limiter()
    except Exception as build_error:  # no Limiter to count it in (every request logs this,
        # unthrottled, until the settings are fixed)
        logger.error("ratelimit_app: unexpected %s while %s: %s; and no Limiter to count it "
                     "(building one raised %s: %s)", type(error).__name__, action, error,
                     type(build_error).__name__, build_error, exc_info=error)
        return
    limiter.unexpected_error(error, action)


def _keep(request, decision):
    setattr(request, DECISION_ATTR, decision)
    if decision.meter is None:  # a metered request is counted at its cost, once settled
        default_limiter().record(decision)
    return decision


def mark_authentication_failed(request):
    """Note that credentials sent with ``request`` (a Django HttpRequest or a DRF Request) were
    wrong; ``charge_failed_authentication`` charges it once the response is ready."""
    request = getattr(request, "_request", request)  # DRF's Request wraps Django's
    if request is not None:
        setattr(request, AUTH_FAILED_ATTR, True)


def charge_failed_authentication(request, response):
    """Return the response to send: ``response``, or a 429 if ``request`` failed to
    authenticate and its client IP has no failed authentications left."""
    if not authentication_failed(request, response):
        return response
    try:
        limiter = default_limiter()
        if not limiter.enabled:
            return response
        decision = limiter.protection.failed_authentication(request, endpoint_name(request))
    except Exception as error:  # the limiter must never be the reason for a 500
        _unexpected(error, "charging a failed authentication; not charged")
        return response
    return _refusal(request, decision) or response


async def acharge_failed_authentication(request, response):
    """``charge_failed_authentication`` for an event loop."""
    if not authentication_failed(request, response):
        return response
    try:
        limiter = default_limiter()
        if not limiter.enabled:
            return response
        decision = await limiter.protection.afailed_authentication(request,
                                                                   endpoint_name(request))
    except Exception as error:  # the limiter must never be the reason for a 500
        _unexpected(error, "charging a failed authentication; not charged")
        return response
    return _refusal(request, decision) or response


def check_failed_authentication(request):
    """Return a 429 if ``request``'s client IP has no failed authentications left, else None.

    For requests no ordinary decision covers (exempt paths such as the admin's login form):
    without it, a blocked client could still learn that a guess was right.
    """
    try:
        limiter = default_limiter()
        if not limiter.enabled:
            return None
        decision = limiter.protection.failed_authentication(
            request, endpoint_name(request), charge=False)
    except Exception as error:
        _unexpected(error, "checking failed authentications; request allowed")
        return None
    return _refusal(request, decision)


async def acheck_failed_authentication(request):
    """``check_failed_authentication`` for an event loop."""
    try:
        limiter = default_limiter()
        if not limiter.enabled:
            return None
        decision = await limiter.protection.afailed_authentication(
            request, endpoint_name(request), charge=False)
    except Exception as error:
        _unexpected(error, "checking failed authentications; request allowed")
        return None
    return _refusal(request, decision)


def count_response(request, response):
    """Count ``response`` once it is ready, when a rule counts responses (a ban rule, or a
    rule counting only some statuses or paths); never fails the response."""
    try:
        limiter = default_limiter()
        # Protection.counts_responses written out: every response asks, and nearly always no
        # rule counts it
        snapshot = limiter.policies.snapshot
        if snapshot is None or not snapshot.counts_responses or not limiter.enabled:
            return
        limiter.protection.count_response(request, getattr(request, DECISION_ATTR, None),
                                          response.status_code,
                                          failed_auth=authentication_failed(request, response),
                                          path=request.path)
    except Exception as error:  # the limiter must never fail a response
        _unexpected(error, "counting a response; not counted")


def _refusal(request, decision):
    if decision is None or decision.allowed:
        return None
    if getattr(request, DECISION_ATTR, None) is None:
        default_limiter().record(decision)  # otherwise counted already, as its request
    setattr(request, DECISION_ATTR, decision)  # the middleware's headers describe the refusal
    return problem_response(decision)


def authentication_failed(request, response):
    """True if ``request``'s credentials were wrong, as far as ``request`` and ``response``
    show (what the charge functions check first)."""
    if getattr(request, AUTH_FAILED_ATTR, False):
        return True
    meta = request.META
    api_key_header = get_config()["API_KEY_HEADER"]
    sent_key = bool(api_key_header and meta.get(meta_key(api_key_header)))
    if response.status_code == 401 and (sent_key or meta.get("HTTP_AUTHORIZATION")
                                        or sent_key_credentials(request)):
        return True
    # DRF's AuthenticationFailed: 403 when the first authenticator sends no WWW-Authenticate
    # (SessionAuthentication listed before a token scheme), and with no authenticate() call
    if response.status_code in (401, 403) and _drf_error_code(response) == "authentication_failed":
        return True
    # an API key that names no active key: the caller was limited as anonymous (unless a deny
    # list refused it: it reached no view, and tried nothing)
    decision = getattr(request, DECISION_ATTR, None)
    identity = decision.identity if decision is not None else None
    return sent_key and identity is not None and identity.kind != "key" and \
        (decision.listed is None or decision.allowed)


def _drf_error_code(response):
    """Return the code of a DRF error response's ``detail`` (e.g. "authentication_failed"), or
    None. Read without importing DRF: ErrorDetail is a str with a ``code``."""
    data = getattr(response, "data", None)
    detail = data.get("detail") if isinstance(data, dict) else None
    return getattr(detail, "code", None)
