"""DRF's throttle rates kept: ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` as plans and rules.

A project that replaces DRF's ``AnonRateThrottle``, ``UserRateThrottle`` and
``ScopedRateThrottle`` by ``QuotaThrottle`` keeps its limits: ``migrate`` turns the rates into
rows (``runtime/signals.py`` calls ``import_drf_rates`` after the app's migrations), which the
operator then sees and edits in the admin like any other, and the audit trail records them as
imported.

Why on ``migrate``: it runs once per deployment in one process (never in every worker at once),
before the workers serve, and the rows it writes are ordinary rows from then on. It imports only
into an empty configuration (no plan, no rule) and only once (an earlier import in the audit
trail stops it), so re-running ``migrate`` never undoes an operator's edit or brings back a row
the operator deleted.

The mapping, DRF's semantics kept:

- ``anon``: a plan for anonymous clients (*default for anonymous clients*) with a rule per
  client IP, as ``AnonRateThrottle`` keys anonymous requests by address.
- ``user``: a plan for signed-in users (*default for signed-in users*) with a rule per user or
  API key. ``UserRateThrottle`` also counts anonymous requests by address; when the rates name
  no ``anon``, the anonymous plan gets the ``user`` rate per client IP instead.
- each ``throttle_scope`` that a view of the URLconf names (``ScopedRateThrottle``): a rule on
  that view's endpoint, per client IP on the anonymous plan and per user on the signed-in plan,
  as the scoped throttle keys by user when signed in and by address otherwise.
- DRF's "N/period" (``s``, ``m``, ``h``, ``d``: 1, 60, 3600, 86400 s) allows N requests in any
  window of the period; the rule is a token bucket of burst N refilled at N per period: N
  requests at once, then N again once the period has passed, as DRF allows them; within the
  period the bucket gives a token back every period/N seconds where DRF waits for the oldest
  request to leave its window.
"""

import re
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from ..decision.scopes import Scope
from .choices import RULE_NAME_RE
from .endpoints import scoped_endpoints

__all__ = ["IMPORT_ACTOR", "DrfRateError", "ImportedRule", "parse_drf_rate", "drf_rate_rows",
           "import_drf_rates"]

# The audit trail's actor of the import: an entry by it means the rates were imported once.
IMPORT_ACTOR = "migrate: DRF's DEFAULT_THROTTLE_RATES"

# DRF reads the first letter of the period only ("min", "minute" and "m" are all minutes).
_PERIOD_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([A-Za-z]+)\s*$")

ANONYMOUS_PLAN = {"slug": "anonymous", "name": "Anonymous clients", "default_for_anonymous": True}
SIGNED_IN_PLAN = {"slug": "signed-in", "name": "Signed-in users",
                  "default_for_authenticated": True}
PLAN_DESCRIPTION = "Imported from REST_FRAMEWORK['DEFAULT_THROTTLE_RATES'] by migrate."


class DrfRateError(ValueError):
    """A rate DRF's throttles would not read either; the message names it."""


@dataclass(frozen=True)
class ImportedRule:
    """One rule the import makes: on the anonymous or the signed-in plan (``plan``: "anonymous"
    or "signed-in")."""

    name: str
    plan: str
    scope: str
    endpoint: str
    rate: int
    period_s: int

    @property
    def burst(self):
        return self.rate


def parse_drf_rate(text):
    """Return ``(requests, period_s)`` of a DRF rate such as ``"3/min"`` or ``"2/sec"``;
    raise DrfRateError for anything else (DRF itself fails on it at the first request)."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if not match or match[2][0].lower() not in _PERIOD_S or int(match[1]) < 1:
        raise DrfRateError(f"{text!r} is not a DRF rate such as '100/day' or '3/min' (at least "
                           f"1 request per s, m, h or d)")
    return int(match[1]), _PERIOD_S[match[2][0].lower()]


def _rule_name(*parts):
    """A rule name from DRF's names: the characters a name may hold, at most 64 of them."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", "-".join(parts)).strip("-_.")[:64]
    return name if RULE_NAME_RE.match(name or "") else "drf"


def _configured_rates():
    """The project's ``DEFAULT_THROTTLE_RATES`` (empty when it names none)."""
    rates = (getattr(settings, "REST_FRAMEWORK", None) or {}).get("DEFAULT_THROTTLE_RATES")
    return rates if isinstance(rates, dict) else {}


def drf_rate_rows(rates=None, urlconf=None):
    """Return ``(rules, problems)``: the ImportedRules of ``rates`` (the project's
    ``DEFAULT_THROTTLE_RATES`` unless given) and the URLconf's ``throttle_scope`` views, and one
    line per rate that could not be read (skipped). Scopes no view names are skipped too."""
    if rates is None:
        rates = _configured_rates()
    parsed, problems = {}, []
    for scope, text in rates.items():
        if text is None:  # DRF's own default: {"anon": None, "user": None}
            continue
        try:
            parsed[scope] = parse_drf_rate(text)
        except DrfRateError as exc:
            problems.append(f"DEFAULT_THROTTLE_RATES[{scope!r}]: {exc}; not imported.")
    rules, names = [], set()

    def add(name, plan, scope, endpoint, rate):
        name = _rule_name(name)
        while name in names:  # two views' names sanitized alike: keep both rules
            name = _rule_name(f"{name[:60]}-{len(names)}")
        names.add(name)
        rules.append(ImportedRule(name, plan, scope, endpoint, *rate))

    anonymous_rate = parsed.get("anon") or parsed.get("user")
    if anonymous_rate:
        add("anon" if "anon" in parsed else "user-ip", "anonymous", Scope.IP, "",
            anonymous_rate)
    if "user" in parsed:
        add("user", "signed-in", Scope.USER, "", parsed["user"])
    other_scopes = set(parsed) - {"anon", "user"}
    scoped = [(endpoint, scope) for endpoint, scope in
              (scoped_endpoints(urlconf) if other_scopes else ()) if scope in parsed]
    for endpoint, scope in scoped:
        # the scope's name alone when one view names it, else the endpoint's too
        label = scope if sum(s == scope for _, s in scoped) == 1 else f"{scope}-{endpoint}"
        add(f"{label}-ip", "anonymous", Scope.IP, endpoint, parsed[scope])
        add(f"{label}-user", "signed-in", Scope.USER, endpoint, parsed[scope])
    return rules, problems


def import_drf_rates(using="default"):
    """Create the plans and rules of the project's DRF rates when the configuration is empty
    and they were never imported; return ``(rules created, problems)`` (nothing created: an
    empty list). One transaction, one audit entry (source: import)."""
    from .audit import Actor, acting_as
    from .models import AuditEntry, AuditSource, Plan, Rule

    if not _configured_rates() or Plan.objects.using(using).exists() \
            or Rule.objects.using(using).exists() \
            or AuditEntry.objects.using(using).filter(actor=IMPORT_ACTOR).exists():
        return [], []  # the common case: read no URLconf
    rules, problems = drf_rate_rows()  # the problems: migrate prints them
    if not rules:
        return [], problems
    with acting_as(Actor(IMPORT_ACTOR, AuditSource.IMPORT)), transaction.atomic(using=using):
        plans = {}
        for fields in (ANONYMOUS_PLAN, SIGNED_IN_PLAN):
            if any(rule.plan == fields["slug"] for rule in rules):
                plans[fields["slug"]] = Plan.objects.using(using).create(
                    description=PLAN_DESCRIPTION, **fields)
        for rule in rules:
            Rule.objects.using(using).create(
                name=rule.name, plan=plans[rule.plan], scope=rule.scope, endpoint=rule.endpoint,
                rate=rule.rate, period_s=rule.period_s, burst=rule.burst)
    return rules, problems
