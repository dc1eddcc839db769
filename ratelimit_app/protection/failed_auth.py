"""The failed-authentication gate: guessing credentials is limited per client address.

Each failed authentication (a wrong password, a 401 to a request carrying credentials, an API
key naming no active key) costs the client IP one token of its failed-auth rules. While the
address has none left, the gate refuses the credentials the address sends, so guessing stops and
a right guess looks exactly like a wrong one (the refusal names only the gate, and its
Retry-After jitter is seeded by the address alone).

The ordinary decision checks the gate in its own take.lua call (``engine.plan_buckets`` plans it
as a bucket that is checked, never debited); this module charges a failure once the response
shows it, and checks the gate where no ordinary decision runs (an exempt login form).
"""

from ..conf import get_config
from ..decision import engine
from ..decision.buckets import Bucket
from ..decision.identity import identify
from ..decision.keys import bucket_key
from ..decision.scopes import Scope
from ..stores import StoreUnavailable
from .lists import is_trusted

__all__ = ["FailedAuthGate", "failed_auth_buckets"]


def failed_auth_buckets(snapshot, identity, endpoint):
    """Return the buckets one failed authentication of ``identity`` is charged to (its client
    IP's failed-auth rules, one token each), or () when none applies or the caller is exempt."""
    if not snapshot.failed_auth_rules:
        return ()
    overrides = engine.overrides_for(snapshot, identity)
    if any(o.exempt for o in overrides):
        return ()
    token = identity.token_for(Scope.IP)
    prefix = get_config()["KEY_PREFIX"]
    return tuple(
        Bucket(rule, bucket_key(prefix, token), 1)
        for rule in (engine.with_override_numbers(r, overrides) if overrides else r
                     for r in snapshot.rules_for(None, endpoint) if r.failed_auth))


class FailedAuthGate:
    """Charge and check failed authentications for a Limiter.

    ``take`` and ``atake`` are the Limiter's store calls through its circuit breaker (they raise
    StoreUnavailable), ``snapshot`` and ``asnapshot`` give its rules in force.
    """

    def __init__(self, *, take, atake, snapshot, asnapshot, wall_time):
        self._take, self._atake = take, atake
        self._snapshot, self._asnapshot = snapshot, asnapshot
        self._wall_time = wall_time

    def charge(self, request, endpoint, *, charge=True, now_ms=None):
        """Charge one failed authentication of ``request`` to its client IP's failed-auth
        buckets (``charge=False``: only check that they hold one). Returns the Decision, refused
        when a bucket is out of tokens, or None when no failed-auth rule applies."""
        found = _buckets_of(self._snapshot(), request, endpoint, self._wall_time)
        if found is None:
            return None
        identity, buckets = found
        try:
            reply = self._take(buckets, now_ms=now_ms, debit=charge)
        except StoreUnavailable:
            return engine.degraded_decision(buckets, identity, endpoint, 1)
        return _decision(buckets, identity, endpoint, reply)

    async def acharge(self, request, endpoint, *, charge=True, now_ms=None):
        """``charge`` for an event loop."""
        found = _buckets_of(await self._asnapshot(), request, endpoint,
                            self._wall_time)
        if found is None:
            return None
        identity, buckets = found
        try:
            reply = await self._atake(buckets, now_ms=now_ms, debit=charge)
        except StoreUnavailable:
            return engine.degraded_decision(buckets, identity, endpoint, 1)
        return _decision(buckets, identity, endpoint, reply)


def _buckets_of(snapshot, request, endpoint, wall_time):
    """Return ``(identity, buckets)`` one failed authentication of ``request`` is charged to,
    or None when no failed-auth rule applies or the caller is allow-listed (trusted callers
    are never locked out)."""
    if not snapshot.failed_auth_rules:
        return None
    identity = identify(request, None, snapshot)
    if is_trusted(snapshot, request, identity, wall_time):
        return None
    buckets = failed_auth_buckets(snapshot, identity, endpoint)
    return (identity, buckets) if buckets else None


def _decision(buckets, identity, endpoint, reply):
    """Return the Decision of a failed-auth take's ``reply``."""
    return engine.decision_from(buckets, engine.statuses_from(buckets, reply), reply.allowed,
                                identity, endpoint, 1, failed_authentication=True)
