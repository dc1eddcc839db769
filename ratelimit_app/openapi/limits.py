"""What an OpenAPI schema says about a limited operation, whichever generator wrote the schema.

For each operation the limiter decides (see ``limited_operations``), the schema gains:

- a ``429`` response: the problem body (``application/problem+json``, the
  ``RateLimitProblem`` schema) with ``Retry-After``, ``RateLimit`` and ``RateLimit-Policy``;
  where a rule applying to the operation fails closed, its description and examples say that
  the same 429 (problem type ``temporary-reduced-capacity``) answers while Redis is unreachable;
- a ``402`` response where a prepaid-credits rule applies to it;
- ``RateLimit`` and ``RateLimit-Policy`` on its other responses;
- ``x-ratelimit-cost``: the tokens a request costs on each plan (``{"free": 1, "pro": 5}``),
  read from the compiled policy snapshot (the EndpointCost rows), and ``x-ratelimit-metered``
  where a row is metered (the cost is then an estimate, charged what the request consumed).

A schema is often public: it names only the plans ``OPENAPI_PLANS`` lets it name (by default
the plans a caller gets without an assignment, which any caller learns from its own headers),
and describes only their rules and the rules for every plan: a plan named after a customer,
or which of its rules fail closed, stays out of it.

The refusal's media type is what the caller is served: ``application/problem+json`` where
the middleware or a Ninja API answers; where DRF's ``QuotaThrottle`` refuses, DRF renders the
same problem fields with the view's renderers (``application/json``), and the adapter passes
those media types (``refusal_media_types``).

The components (the problem schema, the three headers) are added once per schema. Nothing here
imports a schema generator: the adapters pass plain dicts.
"""

import re

from ..conf import get_config, openapi_plans_problem
from ..decision.headers import QUOTA_EXCEEDED, TEMPORARY_REDUCED_CAPACITY

__all__ = ["OperationLimits", "operation_limits", "schema_plans", "document_operation",
           "add_components", "route_key", "PROBLEM_SCHEMA_NAME", "PROBLEM_CONTENT_TYPE"]

PROBLEM_SCHEMA_NAME = "RateLimitProblem"
PROBLEM_CONTENT_TYPE = "application/problem+json"
COST_FIELD = "x-ratelimit-cost"
METERED_FIELD = "x-ratelimit-metered"

_HEADERS = {
    "RateLimit": {
        "description": "The caller's own quota policies: `r` whole tokens left, `t` seconds "
                       "until the next one (draft-ietf-httpapi-ratelimit-headers).",
        "schema": {"type": "string"}, "example": '"free-ip";r=39;t=3'},
    "RateLimit-Policy": {
        "description": "Every enforced quota policy of the request: `q` tokens at most in "
                       "any `w` seconds.",
        "schema": {"type": "string"}, "example": '"free-ip";q=40;w=120'},
    "Retry-After": {
        "description": "Seconds to wait before retrying; absent when waiting cannot help (the "
                       "request costs more than a policy holds, or prepaid credits ran out).",
        "schema": {"type": "integer", "minimum": 1}, "example": 12},
}

_PROBLEM_SCHEMA = {
    "type": "object",
    "description": "An RFC 9457 problem: why the quotas refused the request.",
    "properties": {
        "type": {"type": "string", "format": "uri-reference", "example": QUOTA_EXCEEDED},
        "title": {"type": "string", "example": "Quota exceeded"},
        "status": {"type": "integer", "enum": [429, 402]},
        "detail": {"type": "string"},
        "violated-policies": {"type": "array", "items": {"type": "string"},
                              "description": "The policies that refused the request."},
        "retry-after": {"type": "integer",
                        "description": "Retry-After's seconds, for scripts that cannot read "
                                       "the header."},
        "credits-exhausted": {"type": "array", "items": {"type": "string"},
                              "description": "402 only: the credit balances used up."},
    },
    "required": ["type", "title", "status", "detail", "violated-policies"],
}


class OperationLimits:
    """What applies to one operation: ``costs`` (plan slug -> tokens), ``metered`` (plan
    slug -> minimum charge, for metered rows), the names of the prepaid ``credits`` rules
    (refusing with 402), of the rules that fail ``closed``, and of the enforced quota
    ``policies`` (refusing with 429)."""

    def __init__(self, costs, metered, credits, fails_closed, policies):
        self.costs, self.metered = costs, metered
        self.credits, self.fails_closed, self.policies = credits, fails_closed, policies


def schema_plans(snapshot):
    """Return the slugs of the plans of ``snapshot`` that a schema may name (OPENAPI_PLANS),
    sorted; none when the setting is not valid (system check E014 says so)."""
    setting = get_config()["OPENAPI_PLANS"]
    if openapi_plans_problem(setting):
        return []
    if setting == "all":
        return sorted(snapshot.plans)
    if setting == "defaults":
        return sorted({snapshot.default_authenticated_plan,
                       snapshot.default_anonymous_plan} - {None})
    return sorted(set(setting) & snapshot.plans)


def operation_limits(snapshot, endpoint, method, plans=None):
    """Return the OperationLimits of requests with ``method`` to ``endpoint`` on the rules and
    costs of ``snapshot``: over ``plans`` (slugs; by default ``schema_plans``), and the rules
    for every plan."""
    plans = schema_plans(snapshot) if plans is None else plans
    costs = {plan: snapshot.cost_for(endpoint, method, plan) for plan in plans}
    metered = {}
    for plan in plans:
        minimum = snapshot.minimum_if_metered(endpoint, method, plan)
        if minimum is not None:
            metered[plan] = minimum
    # (rules_for(None, ...): the rules for every plan alone)
    rules = {rule for plan in (None, *plans) for rule in snapshot.rules_for(plan, endpoint)
             if not rule.shadow and not rule.failed_auth}
    return OperationLimits(
        costs=costs, metered=metered,
        credits=sorted(rule.name for rule in rules if rule.credits),
        fails_closed=sorted(r.name for r in rules if not r.lets_through_without_redis()),
        policies=sorted(rule.name for rule in rules if not rule.credits))


def document_operation(operation, limits, ref_prefix="#/components",
                       media_types=(PROBLEM_CONTENT_TYPE,)):
    """Add the limits' responses, headers and extension fields to ``operation`` (an OpenAPI
    operation object, changed in place); the refusals' bodies are documented under
    ``media_types``, those the caller is served."""
    responses = operation.setdefault("responses", {})
    quota_headers = {name: {"$ref": f"{ref_prefix}/headers/{name}"}
                     for name in ("RateLimit", "RateLimit-Policy")}
    for response in responses.values():
        if "$ref" not in response:
            response.setdefault("headers", {}).update(quota_headers)
    refused_headers = {**quota_headers,
                       "Retry-After": {"$ref": f"{ref_prefix}/headers/Retry-After"}}
    responses["429"] = _refusal(limits, refused_headers, ref_prefix, media_types)
    if limits.credits:
        names = ", ".join(limits.credits)
        example = {"type": "about:blank", "title": "Payment Required", "status": 402,
                   "detail": f"The credits of {limits.credits[0]} are used up: top the "
                             "balance up to go on.",
                   "violated-policies": limits.credits[:1],
                   "credits-exhausted": limits.credits[:1]}
        responses["402"] = {
            "description": f"Refused by prepaid credits ({names}): the caller's credits are "
                           "used up (top the balance up; waiting does not help unless an "
                           "allowance refills).",
            "headers": refused_headers,
            "content": {media_type: {
                "schema": {"$ref": f"{ref_prefix}/schemas/{PROBLEM_SCHEMA_NAME}"},
                "example": example} for media_type in media_types}}
    if limits.costs:
        operation[COST_FIELD] = dict(limits.costs)
    if limits.metered:
        operation[METERED_FIELD] = dict(limits.metered)
    return operation


def _refusal(limits, headers, ref_prefix, media_types):
    policies = ", ".join(limits.policies) or "the project's quotas"
    description = f"Refused by a quota ({policies}): retry after Retry-After seconds."
    examples = {"quota-exceeded": {"value": {
        "type": QUOTA_EXCEEDED, "title": "Quota exceeded", "status": 429,
        "detail": "Quota exceeded for free-ip. Retry in 12 s.",
        "violated-policies": ["free-ip"], "retry-after": 12}}}
    if limits.fails_closed:
        names = ", ".join(limits.fails_closed)
        description += (f" Also while the rate limiter cannot reach its store: {names} "
                        "refuse requests then (problem type temporary-reduced-capacity).")
        examples["temporary-reduced-capacity"] = {"value": {
            "type": TEMPORARY_REDUCED_CAPACITY, "title": "Temporarily reduced capacity",
            "status": 429, "detail": "The rate limiter cannot reach its store and these "
                                     "policies refuse requests until it is back. Retry in 5 s.",
            "violated-policies": limits.fails_closed[:1], "retry-after": 5}}
    return {"description": description, "headers": headers,
            "content": {media_type: {
                "schema": {"$ref": f"{ref_prefix}/schemas/{PROBLEM_SCHEMA_NAME}"},
                "examples": examples} for media_type in media_types}}


def add_components(schema):
    """Add the problem schema and the three headers to ``schema``'s components (in place)."""
    components = schema.setdefault("components", {})
    components.setdefault("schemas", {})[PROBLEM_SCHEMA_NAME] = _PROBLEM_SCHEMA
    components.setdefault("headers", {}).update(_HEADERS)
    return schema


_PARAMETER = re.compile(r"<(?:[^<>:]+:)?([^<>]+)>|\{(?:[^{}:]+:)?([^{}]+)\}")


def route_key(route):
    """Return ``route`` (a Django route such as ``/api/items/<int:pk>/``, or an OpenAPI path
    such as ``/api/items/{pk}/``) with each parameter as ``{name}``, so the two compare."""
    return _PARAMETER.sub(lambda m: "{" + (m.group(1) or m.group(2)) + "}", route)
