"""``Protection``: the Limiter's side of the protection package, for one process.

The failed-authentication gate, the penalty box and the lists (``ratelimit_app.protection``)
are pure rules and store calls; what they need at run time (the Limiter's store calls through
its breaker, its rules in force, its deny cache, the audit trail and the webhooks) is wired
here, so the Limiter only owns one ``Protection`` and hands it what is not an ordinary
decision: a failed authentication, a finished response, a ban lifted by staff.

Callers reach it as ``default_limiter().protection``; the ordinary decision reads only the
lists' ``screen`` from here (the ban gate and the failed-auth gate are planned as buckets by
``decision.engine``).
"""

import logging

from ..business.alerts.bans import BanLog
from ..decision import engine
from ..decision.buckets import BanGate
from ..decision.identity import identify
from ..protection import bans
from ..protection.bans import PenaltyBox
from ..protection.failed_auth import FailedAuthGate
from ..protection.lists import is_trusted
from ..stores import StoreUnavailable

__all__ = ["Protection"]

logger = logging.getLogger("ratelimit_app")


class Protection:
    """Failed authentications, response counting and bans for ``limiter`` (a Limiter, which
    builds its Protection when it is built: the two share one store, breaker and snapshot)."""

    def __init__(self, limiter):
        self._limiter = limiter
        self._policies = limiter.policies
        self._wall_time = limiter.wall_time
        self.failed_auth = FailedAuthGate(take=limiter.take, atake=limiter.atake,
                                          snapshot=limiter.policies.get,
                                          asnapshot=limiter.asnapshot,
                                          wall_time=limiter.wall_time)
        self.bans = PenaltyBox(limiter.store, guarded=limiter._guarded,
                               now_ms=limiter.clock.redis_now_ms)
        # the bans' records, written by a background thread (business/alerts/bans.py)
        self.ban_log = BanLog(lambda: limiter.config, autostart=limiter.alerts.autostart)

    # --- failed authentication ---------------------------------------------------------------

    def failed_authentication(self, request, endpoint, *, charge=True, now_ms=None):
        """Charge one failed authentication of ``request`` to its client address (see
        protection/failed_auth.py; ``charge=False``: only check). Returns the Decision, or None
        when no failed-auth rule applies."""
        return self.failed_auth.charge(request, endpoint, charge=charge, now_ms=now_ms)

    async def afailed_authentication(self, request, endpoint, *, charge=True, now_ms=None):
        """``failed_authentication`` for an event loop. Returns the Decision or None."""
        return await self.failed_auth.acharge(request, endpoint, charge=charge, now_ms=now_ms)

    # --- responses and bans ------------------------------------------------------------------

    def counts_responses(self):
        """True when the rules in force count responses: a ban rule, or a rule counting
        responses (the adapters then report responses to ``count_response``)."""
        # (the rules in memory, never a compile: a response is no time to wait for the
        # database, and the watcher or the next decision loads them)
        snapshot = self._policies.snapshot
        return snapshot is not None and snapshot.counts_responses

    def count_response(self, request, decision, status, *, failed_auth, path):
        """Count a sent response: one token on the buckets of the rules counting responses it
        matches (settle.lua, sent without waiting: Limiter.settle_units_later), and its events
        towards its caller's bans (``count_ban_events``)."""
        snapshot = self._policies.snapshot
        if snapshot.response_rules and decision is not None and decision.identity is not None \
                and decision.allowed:
            buckets = engine.response_buckets(snapshot, decision.identity, decision.endpoint,
                                              status, path)
            if buckets:
                self._limiter.settle_units_later(buckets, 1, _ignore)
        if snapshot.ban_rules:
            self.count_ban_events(request, decision, status, failed_auth=failed_auth,
                                  path=path)

    def count_ban_events(self, request, decision, status, *, failed_auth, path):
        """Count a finished request's events towards its caller's bans (protection/bans.py):
        ``decision`` is the request's (or None), ``status`` its response's. Notes each ban it
        imposed or extended for the ban log (``_record_bans``). Returns the
        BanOutcomes; none when no ban rule counts this response or Redis cannot answer."""
        snapshot = self._policies.get()
        if not snapshot.ban_rules:
            return ()
        identity = decision.identity if decision is not None and decision.identity else \
            identify(request, None, snapshot)
        if identity.trusted or (decision is None or decision.identity is None) and \
                is_trusted(snapshot, request, identity, self._wall_time):
            return ()  # an allow-listed caller is never banned: nothing counted, no call
        banned = decision.banned if decision is not None else ()
        found = self.bans.events_of(snapshot, identity, path, status,
                                    bans.refusing_scopes(decision), failed_auth, banned)
        if not found:
            return ()
        deny_cache = self._limiter.deny_cache
        sent_at = None if deny_cache is None else deny_cache.now()  # (before ban.lua's call)
        try:
            outcomes = self.bans.count(identity, found, retry=bool(banned))
        except StoreUnavailable as exc:
            logger.warning("ratelimit_app: a ban event was not counted (%s)", exc)
            return ()
        if deny_cache is not None:
            _remember_bans(deny_cache, outcomes, snapshot.version, sent_at)
        self._record_bans(outcomes)
        return outcomes

    def _record_bans(self, outcomes):
        """Note the new bans, would-be bans and bans extended by a retry among ``outcomes``
        for the ban log's thread (business/alerts/bans.py): no database write here, and what
        it writes is bounded per rule and interval."""
        noted = [o for o in outcomes if o.outcome in (bans.BANNED, bans.WOULD_BAN) or
                 o.outcome == bans.ALREADY_BANNED and o.rule.extend_on_retry]
        if noted:
            self.ban_log.note(noted, shadow_outcome=bans.WOULD_BAN,
                              extended_outcome=bans.ALREADY_BANNED)

    def lift_ban(self, ban, actor):
        """Lift ``ban`` (a Ban row) now: end it in Redis, log who lifted it (``actor``, an
        audit Actor) in the ban log, and announce a new config version so no worker's deny
        cache keeps refusing. Returns True if a ban was in force. Raises StoreUnavailable."""
        from ..config.ban_records import record_lift

        rule = next((r for r in self._policies.get().ban_rules if r.id == ban.rule_id), None)
        lifted = False
        if rule is not None:
            lifted = any(o.outcome == bans.LIFTED for o in self.bans.lift(ban.key, [rule]))
        record_lift(ban, actor)
        self._limiter.bump_config_version(parts=())  # no rows changed: the deny caches forget
        return lifted


def _remember_bans(deny_cache, outcomes, version, sent_at):
    """Tell this worker's deny cache of the bans imposed or extended among ``outcomes`` (ban.lua
    ran after ``sent_at``, a reading of the cache's clock): its next answer to the caller, from
    memory or not, then says banned, never "quota exceeded" from a quota it remembered short.
    (Other workers learn the ban at their next call to Redis for that caller: until then they
    refuse it from memory for the quota, see docs/reference/headers.md.)"""
    gates, statuses = [], []
    for o in outcomes:
        if o.outcome in (bans.BANNED, bans.ALREADY_BANNED):
            gate = BanGate(o.rule.gate_rule, o.key)
            # the gate's level counts the ban's milliseconds left below full (bans.py)
            left_ms = o.until_ms - o.at_ms
            gates.append(gate)
            statuses.append(gate.status(gate.capacity_units - left_ms * gate.rule.rate, True))
    if gates:
        deny_cache.remember(gates, statuses, version, sent_at)


def _ignore(reply):
    """A settle's reply nobody waits for (a counted response: its decision was counted)."""
