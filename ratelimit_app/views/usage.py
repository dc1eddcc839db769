"""The usage endpoint: a client reads its own quotas without spending them (like GitHub's
``GET /rate_limit``). Mounted by ``ratelimit_app.urls`` as ``usage/``.

``usage_view`` identifies the caller exactly as the limiter does (``identity.identify`` on the
Limiter's snapshot: the API key header, else the signed-in ``request.user``, else the client
IP), reads every bucket that applies to it on any endpoint in one non-debiting script call
(``Limiter.peek_buckets``) and answers with its policies as JSON, in the numbers of the
RateLimit headers (``limit`` = q, ``window`` = w, null for a concurrency limit, which has no w,
``remaining`` = r, ``reset`` = t: never 0, see decision/headers.py). The view is
exempt from the limits: a plain Django view, so neither the middleware nor DRF's throttles
charge it. Shared buckets (scopes global, plan, tenant) give their remaining tokens only with
``DISCLOSE_SHARED_REMAINING``, as in the headers. A caller with an API key or a user account also
gets its usage records of the month so far (``month_to_date``: per rule, units, allowed and
refused, as rolled up into the database; see business/usage/records.py), read with its buckets;
anonymous callers, counted together, get null.

Why it is not a free way to hammer Redis:

- A reading is kept per caller (identity and config version) for ``ANSWER_TTL_S``: however
  often one caller asks, a worker reads its buckets at most once a second.
- A worker reads at most ``READS_PER_S`` times a second in all, so callers that are cheap to
  make up (IP addresses) cannot multiply the first bound; past it the answer is 503 with
  ``Retry-After: 1``, and no quota is touched.
- Anonymous callers (known by their address alone, which costs nothing to make up) may spend
  only ``ANONYMOUS_READS_PER_S`` of that budget: a flood from fresh addresses leaves the rest
  to callers with an API key or an account, which an attacker cannot make up by the thousand
  (and each of which costs at most one read a second, by the first bound). Two counters per
  worker, whatever the number of callers.
- At most ``MAX_ANSWERS`` readings are kept (the oldest go first), so memory is bounded too.

A caller a deny-list entry matches gets the 403 its requests get (no store read); a caller
with an exempt allow entry is ``exempt``; a banned caller gets the ban's 429, as on any
endpoint.

Why it is not a free way to guess API keys: a key header that names no key is charged to the
client IP's failed authentications (by the middleware, as on any endpoint), and a client IP out
of them is refused with the same 429 whatever it sends. Such a request never gets a kept
answer that is not a refusal: that answer could predate the IP running out, and a right guess
(a fresh reading, refused) would then look different from a wrong one.
"""

import collections
import datetime
import math
import threading
import time
import weakref
import zoneinfo
from typing import NamedTuple

from django.http import JsonResponse
from django.views.decorators.http import require_safe

from ..business.credits.figures import Allowance, CreditFigures
from ..business.credits.ledger import balance
from ..business.usage.records import month_to_date
from ..conf import get_config, meta_key
from ..decision import engine
from ..decision.balances import BalanceState
from ..decision.headers import OWN_SCOPES, plain_problem, problem_response, window_s
from ..decision.identity import identify
from ..decorators import ratelimit_exempt
from ..metrics.usage import usage_caller
from ..protection.lists import screen
from ..runtime.guard import mark_authentication_failed
from ..runtime.limiter import default_limiter
from ..stores.base import READ_ERRORS

__all__ = ["ANONYMOUS_READS_PER_S", "ANSWER_TTL_S", "MAX_ANSWERS", "READS_PER_S", "usage_view"]

ANSWER_TTL_S = 1.0
READS_PER_S = 100
# the part of READS_PER_S that anonymous callers may spend (see the module's docstring)
ANONYMOUS_READS_PER_S = 25
MAX_ANSWERS = 4096


class Reading(NamedTuple):
    """The statuses of a caller's buckets (in ``engine.client_buckets`` order) at
    ``read_at_ms``."""

    statuses: tuple
    read_at_ms: int
    month_to_date: dict | None = None
    # each credit balance among the buckets, read beside them: {account ref: ledger.Balance,
    # None for an account never charged nor topped up}
    balances: dict | None = None


class _Readings:
    """One Limiter's kept readings per caller, and its budget of store reads this second."""

    def __init__(self, clock):
        self._clock = clock  # the Limiter's monotonic seconds: tests move it, never sleep
        self._lock = threading.Lock()
        self._kept = collections.OrderedDict()  # key -> (expires_at_s, Reading), oldest first
        self._second, self._reads, self._anonymous_reads = None, 0, 0

    def recent(self, key):
        """Return the Reading kept for ``key`` if it is younger than ANSWER_TTL_S, else None."""
        with self._lock:
            entry = self._kept.get(key)
        if entry is None or entry[0] <= self._clock():
            return None
        return entry[1]

    def keep(self, key, reading):
        with self._lock:
            self._kept.pop(key, None)  # re-inserted last: the order stays oldest first
            self._kept[key] = (self._clock() + ANSWER_TTL_S, reading)
            while len(self._kept) > MAX_ANSWERS:
                self._kept.popitem(last=False)

    def may_read(self, anonymous):
        """Count one store read against this second's budget (an ``anonymous`` caller's also
        against the anonymous callers' part of it); False when it is spent."""
        second = int(self._clock())
        with self._lock:
            if second != self._second:
                self._second, self._reads, self._anonymous_reads = second, 0, 0
            if self._reads >= READS_PER_S:
                return False
            if anonymous:
                if self._anonymous_reads >= ANONYMOUS_READS_PER_S:
                    return False
                self._anonymous_reads += 1
            self._reads += 1
            return True


# Kept with the Limiter they were read through: a new Limiter (new settings, a test) starts
# afresh, and none outlives its Limiter.
_readings_by_limiter = weakref.WeakKeyDictionary()
_readings_lock = threading.Lock()


def _readings_for(limiter):
    readings = _readings_by_limiter.get(limiter)
    if readings is None:
        with _readings_lock:
            readings = _readings_by_limiter.get(limiter)
            if readings is None:
                readings = _readings_by_limiter[limiter] = _Readings(limiter.clock.monotonic)
    return readings


@ratelimit_exempt
@require_safe
def usage_view(request):
    """Return the caller's policies as JSON (200); the problem its requests get when a
    deny-list entry refuses it (403), a ban refuses it or its client IP is out of failed
    authentications (429); or a 503 problem when the store cannot be read now."""
    limiter = default_limiter()
    snapshot = limiter.snapshot()
    identity = identify(request, getattr(request, "user", None), snapshot)
    if snapshot.access_lists is not None:
        screening = screen(snapshot, request, identity, "", limiter.wall_time)
        if screening is not None:
            if screening.decision is not None and not screening.decision.allowed:
                return _no_store(problem_response(screening.decision))  # denied: a 403
            if screening.decision is not None:  # an exempt allow entry
                return _json_response(_body(identity, True, []))
            identity = screening.identity  # trusted: never banned, limited as anyone
    unknown_key = _sent_unknown_api_key(request, identity)
    buckets = engine.client_buckets(snapshot, identity)
    if not buckets:  # exempt (None), or no rule applies: nothing to read
        return _json_response(_body(identity, buckets is None, []))
    readings = _readings_for(limiter)
    key = (snapshot.version, identity)
    reading = readings.recent(key)
    if reading is None or (unknown_key and
                           not engine.refusing_gate_statuses(buckets, reading.statuses)):
        if not readings.may_read(anonymous=identity.kind == "anonymous"):
            return _problem_response(
                503, "Usage lookups busy", "This server answers a limited number of usage "
                "lookups a second. Retry in 1 s.", retry_after_s=1)
        try:
            statuses, _allowed = limiter.peek_buckets(buckets)
            balances = _balances(limiter, buckets)
        except READ_ERRORS:
            return _problem_response(
                503, "Rate limiter store unavailable", "The rate limiter cannot reach its "
                "store, so your usage cannot be read now. Your requests are still served "
                "under its failure policy.", retry_after_s=_store_retry_s())
        now_ms = _now_ms(limiter)
        reading = Reading(statuses, now_ms, _month_to_date(identity, now_ms), balances)
        readings.keep(key, reading)
    if engine.refusing_gate_statuses(buckets, reading.statuses):
        # the client IP is out of failed authentications: refused as on any endpoint (the same
        # answer for any credentials, see engine.decision_from)
        decision = engine.decision_from(buckets, reading.statuses, False, identity, "", 1)
        return _no_store(problem_response(decision))
    if unknown_key:
        mark_authentication_failed(request)  # the middleware charges it to the client IP
    body = _body(identity, False, _policies(buckets, reading))
    body["month_to_date"] = reading.month_to_date
    return _json_response(body)


def _balances(limiter, buckets):
    """Return the ledger.Balance of each credit balance among ``buckets`` (read after the
    peek, which sets a balance Redis did not hold): ``{account ref: Balance or None}``.
    Raises what Redis raises."""
    refs = {b.account for b in buckets if b.rule.credits}
    if not refs:
        return {}
    client = limiter.store.metrics_client()
    return {ref: balance(ref, client) for ref in refs}


def _month_to_date(identity, now_ms):
    """Return the caller's usage records of this month so far, or None for an anonymous
    caller (its records are every anonymous caller's)."""
    if identity.kind not in ("key", "user"):
        return None
    zone = zoneinfo.ZoneInfo(get_config()["CALENDAR_TIME_ZONE"])
    today = datetime.datetime.fromtimestamp(now_ms / 1000, zone).date()
    return month_to_date(usage_caller(identity)[0], today)


def _sent_unknown_api_key(request, identity):
    header = get_config()["API_KEY_HEADER"]
    return bool(header and request.META.get(meta_key(header))) and identity.kind != "key"


def _policies(buckets, reading):
    """Return one dict per enforced policy of the caller (failed-auth gates are a safeguard,
    not a quota, and shadow rules are never shown: as in the headers)."""
    disclose_shared = get_config()["DISCLOSE_SHARED_REMAINING"]
    policies = []
    for bucket, status in zip(buckets, reading.statuses):
        if bucket.gate or status.shadow:
            continue
        shared = status.scope not in OWN_SCOPES
        policy = {
            "name": status.name, "scope": status.scope, "endpoint": bucket.rule.endpoint or None,
            "shared": shared, "limit": status.burst,
            # a concurrency limit has no window (its RateLimit-Policy item has no w either)
            "window": window_s(status.burst, status.quota, status.window_s)
            if status.window_s else None,
        }
        if bucket.rule.calendar:
            # a calendar quota: ``reset``/``reset_at`` is the period's boundary
            policy["calendar_period"] = bucket.rule.calendar
        if disclose_shared or not shared:
            reset_at_s = (reading.read_at_ms + status.reset_s * 1000) / 1000
            policy.update(remaining=status.remaining, reset=status.reset_s,
                          reset_at=datetime.datetime.fromtimestamp(reset_at_s,
                                                                   datetime.timezone.utc)
                          .isoformat(timespec="seconds"))
            if bucket.rule.credits:
                policy["credits"] = _credits(bucket, reading.balances[bucket.account],
                                             reading.read_at_ms)
        policies.append(policy)
    return policies


def _credits(bucket, found, read_at_ms):
    """A credit balance's own fields: its figures (business/credits/figures.py: the
    allowance, its period, used and left, the period's consumption, the prepaid units left and
    the units left, below 0 in debt where ``remaining`` is never below 0) and the last
    top-up."""
    state = found.state if found is not None else BalanceState()  # never charged nor topped up
    figures = CreditFigures.of(state, Allowance.of_rule(bucket.rule), read_at_ms)
    top_up = found.last_top_up if found is not None else None
    return {**figures.json_fields(),
            "last_top_up": None if top_up is None else {
                "units": top_up.units,
                "at": top_up.created.astimezone(datetime.timezone.utc).isoformat(
                    timespec="seconds")}}


def _body(identity, exempt, policies):
    # the caller's kind and plan only: never its key, user id or tenant
    return {"identified_by": identity.kind, "plan": identity.plan, "exempt": exempt,
            "policies": policies, "month_to_date": None}


def _now_ms(limiter):
    # the clock the buckets follow (a test's, or this host's, close to Redis's)
    now_ms = limiter.clock.redis_now_ms()
    return int(time.time() * 1000) if now_ms is None else now_ms


def _store_retry_s():
    # the circuit breaker lets the next read through after its cooldown
    return max(1, math.ceil(get_config()["BREAKER_COOLDOWN_S"]))


def _no_store(response):
    response["Cache-Control"] = "no-store"  # one client's live numbers: no cache may keep them
    return response


def _json_response(body):
    return _no_store(JsonResponse(body))


def _problem_response(status, title, detail, *, retry_after_s):
    response = plain_problem(status, title, detail)
    response["Retry-After"] = str(retry_after_s)
    return response
