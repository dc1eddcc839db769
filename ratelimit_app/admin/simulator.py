"""“What would this request do?”: the admin simulator, a read-only run of the engine's steps.

It asks the Limiter for a ``peek`` of a request built here: the same snapshot, identity, cost and
buckets a real request would get, with the script called with ``debit=False`` (it reads and
refills the levels in its reply and writes nothing), so simulating never costs a client a token
and never creates a bucket's key. (A prepaid credit balance Redis does not hold yet is set from
the ledger first, as a real request's first use would: its units are then shown as they are.)
"""

import copy
import dataclasses
from dataclasses import dataclass

from django.contrib.auth.models import AnonymousUser
from django.http import HttpRequest
from django.urls import reverse

from ..conf import get_config, meta_key
from ..config.endpoints import find_endpoint
from ..config.models import AccessListEntry, Rule
from ..config.rule_kinds import form_kind_of
from ..config.wording import count, per_period
from ..decision import engine
from ..decision.buckets import CredentialProof
from ..decision.identity import identify
from ..decision.scopes import Scope, hash_api_key
from ..runtime.limiter import default_limiter
from .placement import admin_url_name

__all__ = ["BucketReport", "Simulation", "simulate"]

# Stands in for the raw API key, which is never stored: the simulator only has the key's row.
_SIMULATED_KEY = "simulated-api-key"


@dataclass(frozen=True, slots=True)
class BucketReport:
    """One bucket the request would be charged against, and what it holds now."""

    name: str
    scope: str              # the scope's label, e.g. "Client IP (each address)"
    endpoint: str           # "" for a rule over every endpoint
    rate: int
    period_s: int
    burst: int
    shadow: bool
    overridden: bool        # numbers come from an identity override, not the rule
    cost: int               # tokens this request takes from this bucket
    fails_open: bool        # what the rule does while Redis is unreachable
    tokens: float | None = None   # current level (None when Redis could not be read)
    short: bool = False           # holds less than the cost
    reset_s: int = 0              # seconds until it holds the cost again (when short)
    full_s: int = 0               # seconds until it is full
    calendar: str = ""            # a calendar quota's period ("day", "month"), else ""
    credits: bool = False         # a prepaid credit balance: tokens are the units left
    refill: str = ""              # a balance's allowance period ("day", "month"; "": once)
    describe: str = ""            # the limit in the rules list's words (see _limit_words)


@dataclass(frozen=True, slots=True)
class Simulation:
    """The outcome of one simulated request. Nothing in Redis was changed to compute it."""

    identity: object            # identity.Identity
    endpoint: str
    method: str
    cost: int
    allowed: bool
    buckets: tuple = ()
    exempt: bool = False
    redis_error: str = ""       # set when Redis could not be read: levels are unknown
    retry_after_s: int = 0      # without the per-client jitter real responses add
    notes: tuple = ()
    listed: object = None       # the allow- or deny-list entry that matched (ListEntry)
    listed_url: str = ""        # its change page

    @property
    def denied_by_list(self):
        """True when a deny-list entry refuses the request (403, no bucket read)."""
        return self.listed is not None and self.listed.deny

    @property
    def denied_by(self):
        """Names of the enforced buckets that would refuse the request."""
        return tuple(b.name for b in self.buckets if b.short and not b.shadow)

    @property
    def shadow_denials(self):
        """Names of the shadow buckets that would count a would-be denial."""
        return tuple(b.name for b in self.buckets if b.short and b.shadow)


def simulate(*, endpoint, method="GET", ip, user=None, api_key=None, user_agent="",
             now_ms=None):
    """Return the Simulation of a request to ``endpoint`` from ``ip``, sent by ``user`` (a User or
    None) or with ``api_key`` (an ApiKey row or None), with ``user_agent``. ``now_ms`` is for
    tests only."""
    limiter = default_limiter()
    snapshot = limiter.snapshot()
    notes = []
    request = _build_request(method, endpoint, ip, user)
    if user_agent:
        request.META["HTTP_USER_AGENT"] = user_agent
    identity_snapshot = snapshot
    if api_key is not None:
        identity_snapshot = _with_key_header(request, api_key, snapshot, notes)
    identity = identify(request, user, identity_snapshot)
    peek = limiter.peek(request, user, endpoint, identity=identity, now_ms=now_ms)
    outcome = {"identity": peek.identity, "endpoint": endpoint, "method": method,
               "cost": peek.cost, **_listed(peek.listed)}
    if peek.listed is not None and peek.buckets is None:
        # a deny entry, or an allow entry exempt from quotas: it decides alone
        return Simulation(allowed=peek.allowed, exempt=peek.allowed, notes=tuple(notes),
                          **outcome)
    if peek.listed is not None:
        notes.append(f"Trusted by an allow-list entry ({peek.listed.matched}: "
                     f"“{peek.listed.reason}”): limited as anyone, never banned.")
    if peek.buckets is None:
        return Simulation(allowed=True, exempt=True, notes=tuple(notes), **outcome)
    if not peek.buckets:
        notes.append("No rule applies to this request: it is not limited.")
        return Simulation(allowed=True, notes=tuple(notes), **outcome)

    original_rules = {rule.id: rule for rule in snapshot.rules}
    # (a credential's proof from the address is no bucket: protection/failed_auth.py)
    shown = [i for i, b in enumerate(peek.buckets) if type(b) is not CredentialProof]
    rows = Rule.objects.in_bulk([peek.buckets[i].rule.id for i in shown])
    if peek.statuses is None:
        reports = tuple(_report(peek.buckets[i], original_rules, rows) for i in shown)
        return Simulation(allowed=peek.allowed, buckets=reports, redis_error=peek.error,
                          notes=tuple(notes), **outcome)
    reports = tuple(_report(peek.buckets[i], original_rules, rows, peek.statuses[i])
                    for i in shown)
    retry_after = 0 if peek.allowed else engine.earliest_retry_s(peek.statuses)
    return Simulation(allowed=peek.allowed, buckets=reports, retry_after_s=retry_after,
                      notes=tuple(notes), **outcome)


def _listed(entry):
    """The Simulation fields of the list entry ``entry`` that matched (None: none did)."""
    if entry is None:
        return {}
    return {"listed": entry,
            "listed_url": reverse(admin_url_name(AccessListEntry, "change"), args=[entry.id])}


def _build_request(method, endpoint, ip, user):
    found = find_endpoint(endpoint)
    request = HttpRequest()
    request.method = method
    request.path = request.path_info = found.route if found else "/"
    request.META = {"REQUEST_METHOD": method, "REMOTE_ADDR": ip, "PATH_INFO": request.path}
    # tenant and plan resolvers of a project may look at request.user, as in a real request
    request.user = user if user is not None else AnonymousUser()
    return request


def _with_key_header(request, api_key, snapshot, notes):
    """Put a stand-in key in the request's API key header; return the snapshot identify() should
    use, in which that stand-in is the chosen key (or the real one if the key is not active)."""
    header = get_config()["API_KEY_HEADER"]
    entry = snapshot.api_keys.get(api_key.digest)
    if not header:
        notes.append("API keys are switched off (API_KEY_HEADER is empty): the key is ignored.")
        return snapshot
    if entry is None:
        notes.append(f"The key {api_key.prefix}… is not active: requests carrying it are limited "
                     f"as if they had no key.")
        return snapshot
    request.META[meta_key(header)] = _SIMULATED_KEY
    return dataclasses.replace(snapshot, api_keys={hash_api_key(_SIMULATED_KEY): entry})


def _limit_words(compiled, row):
    """Return the limit of the rule ``compiled`` (its row ``row``) in the rules list's words
    ("500 requests per second, bursts up to 1,000"), with the numbers this caller gets (an
    identity override's own)."""
    if row is None:  # deleted since the policy in force was loaded: its numbers alone
        return f"{count(compiled.rate)} {per_period(compiled.period_s)}"
    shown = copy.copy(row)
    shown.rate, shown.period_s, shown.burst = compiled.rate, compiled.period_s, compiled.burst
    return form_kind_of(shown).limit_words(shown) or "—"


def _report(bucket, original_rules, rows, status=None):
    rule = bucket.rule
    fails_open = rule.lets_through_without_redis()
    report = BucketReport(
        name=rule.name, scope=Scope(rule.scope).label, endpoint=rule.endpoint, rate=rule.rate,
        period_s=rule.period_s, burst=rule.burst, shadow=rule.shadow,
        overridden=original_rules.get(rule.id, rule) != rule, cost=bucket.cost,
        fails_open=fails_open,
        calendar=rule.calendar, credits=rule.credits, refill=rule.refill,
        describe=_limit_words(rule, rows.get(rule.id)),
    )
    if status is None:
        return report
    return dataclasses.replace(
        report, tokens=status.level_units / bucket.period_ms, short=status.short,
        reset_s=status.reset_s if status.short else 0, full_s=status.full_s)
