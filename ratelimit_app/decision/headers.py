"""Response headers (draft-ietf-httpapi-ratelimit-headers-11, wire format as in -10) and the 429
problem body.

``RateLimit-Policy`` and ``RateLimit`` are RFC 9651 structured-field lists; each item is a policy
name as an sf-string. A token bucket (``rate`` tokens per ``period``, holding at most ``burst``)
maps onto the draft's parameters so that a client that follows them is never refused by that
bucket:

    RateLimit-Policy: "free-ip";q=40;w=120       q = burst, w = seconds to refill it from empty
    RateLimit: "free-ip";r=39;t=3                r = whole tokens left, t = seconds to the next one

- ``q``/``w``: spending at most ``q`` tokens in any ``w`` seconds never empties the bucket
  (``w`` is rounded up). The rate itself is ``q / w``.
- ``r`` (≤ ``q``): the whole tokens left; ``t``: the seconds within which ``r`` is all the client
  can spend (until the next whole token). For a policy that refused the request, ``t`` is the time
  until this request's cost is available, and ``Retry-After`` is never earlier than it.
- A calendar quota (N units per day or month, see ``periods.py``) maps as ``q`` = N, ``w`` = the
  period's length in seconds, ``r`` = N − used, ``t`` = seconds to the next boundary; a refusal's
  ``Retry-After`` is that ``t`` plus the usual jitter.
- A concurrency limit (at most N requests in flight) maps as ``q`` = N with the draft's
  ``qu="concurrent-requests"`` unit and no ``w``; ``r`` = the slots free after this request,
  ``t`` = 1 (a slot may free any moment; never 0, which would say more slots are free now;
  ``Retry-After`` ≥ 1 s).
- ``t`` is never 0 (draft-11: the seconds until additional quota is made available). A full
  token bucket (``r`` = ``q``) counts one token-time: a token spent now is back after it.
- Units are tokens: a request costs its endpoint's cost (rules with an endpoint count calls).
  The draft registers no unit for weighted requests, so ``qu`` is not sent (see docs/reference/headers.md).
- Every enforced policy is listed in ``RateLimit-Policy`` (it is configuration). A shared bucket's
  level (scopes global, plan, tenant) is other clients' traffic: its ``RateLimit`` item is given
  only when it refused the request, or with ``DISCLOSE_SHARED_REMAINING``. Shadow policies are
  never shown.
- A refusal answered from the worker's deny cache (no Redis call) gives ``RateLimit`` items for
  the policies that refused only: the cache knows those are short, not what the others hold.
"""

import hashlib
import json
import math
import operator
import os

from django.http import HttpResponse
from django.http.response import ResponseHeaders

from ..conf import get_config
from .buckets import CreditStatus, LevelStatuses
from .header_fields import policy_item, sf_string, window_s

__all__ = ["window_s", "apply_headers", "apply_headers_unless_set", "problem_body",
           "problem_response", "plain_problem", "retry_after_s", "retry_after_with_jitter",
           "uncharged_preflight", "QUOTA_EXCEEDED", "TEMPORARY_REDUCED_CAPACITY",
           "DENIED_BY_LIST"]

# Problem types the draft registers (RFC 9457 "type" members).
QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
TEMPORARY_REDUCED_CAPACITY = \
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
# The app's own problem type for a caller a deny-list entry refuses (no registry has one): its
# documentation page, where the type is described.
DENIED_BY_LIST = \
    "https://ratelimit-app.github.io/django-ratelimit-app/reference/headers/#denied-by-a-list"
DENIED_STATUS = 403

# Scopes whose bucket only the caller itself spends (a user, an API key, an address).
OWN_SCOPES = frozenset(("user", "ip"))


def policy_header(policies):
    """Return the RateLimit-Policy value for ``policies``."""
    # each status carries its list member, built once per bucket (a calendar quota's window
    # changes with the month: built here, cached by its numbers)
    return ", ".join([p.policy_item or policy_item(p.name, p.burst, p.quota, p.window_s)
                      for p in policies])


def ratelimit_header(policies, disclose_shared=False):
    """Return the RateLimit value for ``policies``: the caller's own buckets, those that refused
    the request and, with ``disclose_shared``, every other one ("" if none)."""
    return ", ".join([f"{p.header_name or sf_string(p.name)};r={p.remaining};t={p.reset_s}"
                      for p in policies if p.short or disclose_shared or p.scope in OWN_SCOPES])


_is_shadow = operator.attrgetter("shadow")


def retry_after_s(decision):
    """Return the Retry-After seconds of a denied decision, or None when waiting cannot help
    (the request costs more than a policy's capacity, or a balance that no refill raises ran
    out of credits)."""
    if decision.over_capacity or not decision.retry_after_s:
        return None
    return decision.retry_after_s


def retry_after_with_jitter(seconds, identity_token):
    """Return ``seconds`` plus a deterministic per-identity jitter of 0..spread seconds, where
    the spread grows with the wait (RETRY_AFTER_JITTER_S at least, RETRY_AFTER_JITTER_RATIO of
    the wait), so clients refused together do not all come back in the same second."""
    config = get_config()
    spread = max(int(config["RETRY_AFTER_JITTER_S"]),
                 math.ceil(seconds * config["RETRY_AFTER_JITTER_RATIO"]))
    if spread <= 0 or not identity_token:
        return seconds
    digest = hashlib.blake2b(identity_token.encode(), digest_size=4).digest()
    return seconds + int.from_bytes(digest, "big") % (spread + 1)


def apply_headers(response, decision):
    """Set RateLimit-Policy, RateLimit and (on a denial that waiting can cure) Retry-After on
    ``response`` (an HttpResponse, or a DRF view's ``headers`` dict)."""
    return _set_fields(response, _field_store(response), decision)


def apply_headers_unless_set(response, decision):
    """``apply_headers``, unless ``response`` has a RateLimit-Policy field already (the view
    set its own, or QuotaThrottle handed them to DRF)."""
    store = _field_store(response)
    # the store's own lookup: Django's has_header raises and catches a KeyError for a field
    # that is absent (the common answer; about 0.5 µs)
    if store is not None:
        already_set = "ratelimit-policy" in store
    else:
        already_set = response.has_header("RateLimit-Policy")
    return response if already_set else _set_fields(response, store, decision)


def _set_fields(response, store, decision):
    """Set the decision's fields in ``store`` (see _field_store), or through ``response``'s own
    ``__setitem__`` when ``store`` is None."""
    if decision.config_version:  # EXPOSE_CONFIG_VERSION (tests and benchmarks)
        _set_config_fields(response, store, decision.config_version)
    visible = decision.policies
    if type(visible) is LevelStatuses:
        return _set_fields_from_levels(response, store, visible)
    if any(map(_is_shadow, visible)) or CreditStatus in map(type, visible):  # (in C)
        # neither a shadow policy nor a credit balance is a rate the client should follow
        visible = [p for p in visible if not p.shadow and type(p) is not CreditStatus]
    fields = {} if store is None else store  # {lower-case name: (name, value)}
    if visible:
        fields["ratelimit-policy"] = ("RateLimit-Policy", policy_header(visible))
        # a refusal answered from this worker's deny cache (deny_cache.py) knows that the
        # policies that refused are short; what the others hold now it does not know
        shown = [p for p in visible if p.short] if decision.from_deny_cache else visible
        items = ratelimit_header(shown, get_config()["DISCLOSE_SHARED_REMAINING"])
        if items:  # an empty list is no field at all (RFC 9651)
            fields["ratelimit"] = ("RateLimit", items)
    if not decision.allowed and retry_after_s(decision) is not None:
        fields["retry-after"] = ("Retry-After", str(decision.retry_after_s))
    if store is None:
        for name, value in fields.values():
            response[name] = value
    return response


def _set_config_fields(response, store, version):
    """Say which config version decided, and in which worker process."""
    fields = (("RateLimit-Config-Version", version), ("RateLimit-Worker", str(os.getpid())))
    for name, value in fields:
        if store is None:
            response[name] = value
        else:
            store[name.lower()] = (name, value)


def _set_fields_from_levels(response, store, statuses):
    """``_set_fields`` for an allowed decision that no bucket was short for (a LevelStatuses):
    the RateLimit-Policy value and which buckets RateLimit shows depend on the buckets alone,
    and are kept on its PlannedBuckets; the RateLimit members are made from the reply's levels.
    No status is built."""
    planned = statuses.planned
    parts = planned.header_parts
    if parts is None:
        parts = planned.header_parts = (_header_parts(planned, False),
                                        _header_parts(planned, True))
    policy_value, shown = parts[bool(get_config()["DISCLOSE_SHARED_REMAINING"])]
    fields = {} if store is None else store
    if policy_value:
        fields["ratelimit-policy"] = ("RateLimit-Policy", policy_value)
        if shown:
            levels = statuses.levels
            fields["ratelimit"] = ("RateLimit", ", ".join(
                [planned[index].rate_limit_item(levels[index]) for index in shown]))
    if store is None:
        for name, value in fields.values():
            response[name] = value
    return response


def _header_parts(planned, disclose_shared):
    """Return ``(RateLimit-Policy value, positions of the buckets RateLimit shows)`` of an
    allowed decision on ``planned`` that no bucket was short for: what ``_set_fields`` would
    find, worked out by the same functions from statuses of full buckets ("" when every policy
    is a shadow one)."""
    statuses = [bucket.status(bucket.capacity_units, False) for bucket in planned]
    # as in _set_fields: neither a shadow policy nor a credit balance is shown
    hidden = [status.shadow or type(status) is CreditStatus for status in statuses]
    visible = [status for status, hide in zip(statuses, hidden) if not hide]
    if not visible:
        return "", ()
    shown = tuple(index for index, status in enumerate(statuses) if not hidden[index] and
                  ratelimit_header([status], disclose_shared))
    return policy_header(visible), shown


def _field_store(response):
    """Return an HttpResponse's own field store (``{lower-case name: (name, value)}``) for
    apply_headers to write directly, or None for anything else (a DRF view's ``headers`` dict,
    a response class with other headers), whose own ``__setitem__`` is used.

    Django's ``response[name] = value`` checks every value's charset and looks for newlines
    (about 1 µs per field, on every response). Ours need neither check: every name is a
    constant, and every value is built of numbers and RFC 9651 sf-strings, which hold printable
    ASCII only (``header_fields.sf_string``).
    """
    headers = getattr(response, "headers", None)
    store = getattr(headers, "_store", None)
    return store if type(headers) is ResponseHeaders and type(store) is dict else None


def _over_capacity_detail(decision):
    statuses = {p.name: p for p in decision.policies}
    parts = []
    for name in decision.over_capacity:
        status = statuses.get(name)
        numbers = f" (cost {status.cost}, capacity {status.burst})" if status else ""
        parts.append(f"policy {name}{numbers}")
    return (f"The cost of this request exceeds the capacity of {', '.join(parts)}: it can "
            "never be served, and retrying will not help. Send a smaller request.")


def problem_body(decision):
    """Return the RFC 9457 problem fields of a denied decision (a new dict); its ``status`` is
    the response's (429; 402 when credits ran out; 403 when a deny list refused)."""
    if decision.listed is not None:
        return _denied_problem(decision)
    if decision.degraded:
        problem_type, title = TEMPORARY_REDUCED_CAPACITY, "Temporarily reduced capacity"
        detail = ("The rate limiter cannot reach its store and these policies refuse requests "
                  f"until it is back. Retry in {decision.retry_after_s} s.")
    elif decision.banned:
        return _ban_problem(decision)
    elif decision.out_of_credits:
        return _credits_problem(decision)
    elif decision.over_capacity:
        problem_type, title = QUOTA_EXCEEDED, "Quota exceeded"
        detail = _over_capacity_detail(decision)
    else:
        problem_type, title = QUOTA_EXCEEDED, "Quota exceeded"
        detail = (f"Quota exceeded for {', '.join(decision.violated)}. "
                  f"Retry in {decision.retry_after_s} s.")
    body = {"type": problem_type, "title": title, "status": 429, "detail": detail,
            "violated-policies": list(decision.violated)}
    if not decision.over_capacity:
        # the body too: browser scripts cannot read Retry-After unless CORS exposes it
        body["retry-after"] = decision.retry_after_s
    return body


# A request refused because its credits ran out is answered 402 Payment Required, not 429:
# waiting does not bring prepaid credits back (a 429 invites clients and SDKs to retry after
# Retry-After, in vain), paying does. about:blank, whose title is the status's phrase: the
# status alone tells the client what happened (RFC 9457, section 4.2.1).
CREDITS_EXHAUSTED_STATUS = 402


def _credits_problem(decision):
    names = ", ".join(decision.out_of_credits)
    body = {"type": "about:blank", "title": "Payment Required",
            "status": CREDITS_EXHAUSTED_STATUS,
            "detail": f"The credits of {names} are used up: top the balance up to go on.",
            "violated-policies": list(decision.violated),
            "credits-exhausted": list(decision.out_of_credits)}
    if decision.retry_after_s:
        body["detail"] += f" Its allowance comes back in {decision.retry_after_s} s."
        body["retry-after"] = decision.retry_after_s
    return body


# A banned caller is answered 429, with its own problem type. Not 403: a ban ends, and 429 with
# Retry-After is what clients and SDKs already wait on and retry after, where a 403 reads as
# "never" (clients give up, or worse, retry at once since no wait is given); and a 429 is what
# the caller was already receiving from the quotas a ban escalates. The type tells a person
# reading the body that this is a ban, not a quota, and the rule that imposed it.
BANNED = "tag:ratelimit-app,2026:banned"


def _ban_problem(decision):
    names = ", ".join(decision.banned)
    return {"type": BANNED, "title": "Banned for a while", "status": 429,
            "detail": f"Too many abusive requests: banned by {names}. The ban ends in "
                      f"{decision.retry_after_s} s; requests before then are refused.",
            "violated-policies": list(decision.violated), "banned-by": list(decision.banned),
            "retry-after": decision.retry_after_s}


def _denied_problem(decision):
    """A deny-list entry refused the caller: 403 (the caller is refused as who it is, not for
    its rate: a 429 would invite it to retry), naming the entry's reason, never what the entry
    matched (a network, a key); a Retry-After only when the entry ends."""
    reason = decision.listed.reason
    body = {"type": DENIED_BY_LIST, "title": "Denied", "status": DENIED_STATUS,
            "detail": f"Requests from this caller are refused: {reason}" if reason else
            "Requests from this caller are refused.", "reason": reason}
    if decision.retry_after_s:
        body["retry-after"] = decision.retry_after_s
    return body


def plain_problem(status, title, detail):
    """Return an RFC 9457 ``about:blank`` problem response that no cache keeps (the usage
    endpoint's and the staff API's errors)."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    response = HttpResponse(json.dumps(body), status=status,
                            content_type="application/problem+json")
    response["Cache-Control"] = "no-store"
    return response


def problem_response(decision):
    """Return the ``application/problem+json`` response for a denied decision: 429, 402
    when credits ran out, or 403 when a deny list refused."""
    body = problem_body(decision)
    response = HttpResponse(json.dumps(body), status=body["status"],
                            content_type="application/problem+json")
    return apply_headers(response, decision)


def uncharged_preflight(request):
    """Return True if ``request`` is a CORS preflight (OPTIONS with Origin and
    Access-Control-Request-Method) and CHARGE_PREFLIGHT is off: browsers report a refused
    preflight as a CORS error, never as a 429, so it is neither charged nor refused."""
    return (request.method == "OPTIONS"
            and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in request.META
            and "HTTP_ORIGIN" in request.META
            and not get_config()["CHARGE_PREFLIGHT"])
