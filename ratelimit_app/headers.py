"""Response headers (draft-ietf-httpapi-ratelimit-headers-10) and the 429 problem body.

``RateLimit-Policy`` and ``RateLimit`` are RFC 9651 structured-field lists with one item per
enforced policy that applied; each item is the policy name as an sf-string:

    RateLimit-Policy: "free-user";q=100;w=60, "global";q=1000;w=1
    RateLimit: "free-user";r=0;t=2, "global";r=993;t=1

``q``/``w`` are the rule's rate and period; ``r`` is the whole tokens left; ``t`` is the seconds
until more quota is available (for a policy that denied: until this request's cost is). Shadow
policies are not shown to clients.
"""

import functools
import hashlib
import json

from django.http import HttpResponse

from .conf import get_config

__all__ = ["apply_headers", "problem_response", "retry_after_with_jitter"]


@functools.lru_cache(maxsize=4096)  # policy names come from the admin: few, and asked per request
def _sf_string(value):
    """Serialise an RFC 9651 sf-string (printable ASCII; quote and backslash escaped)."""
    text = "".join(c for c in value if " " <= c <= "~")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def policy_header(policies):
    """Return the RateLimit-Policy value for ``policies``."""
    return _policy_header(tuple((p.name, p.quota, p.window_s) for p in policies))


@functools.lru_cache(maxsize=1024)  # one value per set of rules: few, and the same every request
def _policy_header(items):
    return ", ".join([f"{_sf_string(name)};q={quota};w={window_s}"
                      for name, quota, window_s in items])


def ratelimit_header(policies):
    """Return the RateLimit value for ``policies``."""
    return ", ".join([f"{_sf_string(p.name)};r={p.remaining};t={p.reset_s}" for p in policies])


def retry_after_with_jitter(seconds, identity_token):
    """Return ``seconds`` plus a deterministic per-identity jitter of 0..RETRY_AFTER_JITTER_S,
    so clients denied together do not all come back in the same second."""
    spread = int(get_config()["RETRY_AFTER_JITTER_S"])
    if spread <= 0 or not identity_token:
        return seconds
    digest = hashlib.blake2b(identity_token.encode(), digest_size=2).digest()
    return seconds + int.from_bytes(digest, "big") % (spread + 1)


def apply_headers(response, decision):
    """Set RateLimit-Policy, RateLimit and (on a denial) Retry-After on ``response``."""
    visible = [p for p in decision.policies if not p.shadow]
    if visible:
        response["RateLimit-Policy"] = policy_header(visible)
        response["RateLimit"] = ratelimit_header(visible)
    if not decision.allowed:
        response["Retry-After"] = str(decision.retry_after_s)
    return response


def problem_response(decision):
    """Return the 429 ``application/problem+json`` response for a denied decision."""
    if decision.degraded:
        detail = ("The rate limiter cannot reach its store and these policies refuse requests "
                  "until it is back.")
    else:
        detail = (f"Quota exceeded for {', '.join(decision.violated)}. "
                  f"Retry in {decision.retry_after_s} s.")
    body = {
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": detail,
        "violated_policies": list(decision.violated),
        "retry_after": decision.retry_after_s,
    }
    response = HttpResponse(json.dumps(body), status=429, content_type="application/problem+json")
    return apply_headers(response, decision)
