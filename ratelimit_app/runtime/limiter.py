"""``Limiter``: the request path, and every piece of per-process state it needs.

A Limiter owns the policy snapshot cache, the local deny cache, the leases of hot buckets, the
circuit breaker, its error counters, the metrics recorder and flusher, the queue of quota-alert
crossings, the store, and its Protection (runtime/protection.py: failed authentications,
counted responses, bans). The adapters (throttle, middleware), the simulator, the inspector
and the benchmarks all call it; the steps it runs are the pure functions of ``engine`` and the
store's scripts. The request path reads one way: adapter → Limiter → pure modules → store.

``default_limiter()`` is the process's Limiter, built from settings on first use and rebuilt when
the settings change; tests install their own through ``install_limiter``.
"""

import logging
import secrets
import threading
import time
from typing import NamedTuple

from asgiref.sync import sync_to_async

from .. import metrics
from ..business.alerts.crossings import AlertQueue
from ..conf import (
    get_config,
    publish_lead_s,
    quota_middleware_installed,
    reload_interval_s,
    watch_interval_s,
)
from ..config.policy import PolicyCache
from ..config.versions import ConfigVersions
from ..decision import engine
from ..decision.breaker import CircuitBreaker
from ..decision.buckets import ConcurrencySlot, CreditBalance, slot_member
from ..decision.clock import SystemClock, process_clock
from ..decision.deny_cache import DenyCache
from ..decision.engine import Decision
from ..decision.forwarding import UntrustedForwarding
from ..decision.identity import identify
from ..decision.leases import Leases
from ..decision.meter import Meter
from ..process.unexpected import UnexpectedErrorLog, error_text, type_label
from ..protection.lists import screen
from ..stores import StoreUnavailable, SupersededRules, build_store
from ..stores.base import BalancesMissing, is_misconfiguration
from .protection import Protection

__all__ = ["Limiter", "LimiterStats", "Peek", "SystemClock", "default_limiter",
           "install_limiter", "forget_default_limiter"]

logger = logging.getLogger("ratelimit_app")

# A decision refused by the fence is made again on fresh rules, at most this many times in all
# (more than once only while versions are published faster than a worker compiles them).
FENCED_ATTEMPTS = 5


def _record_outside_change():
    from ..config.audit import record_outside_change  # the audit trail reads models: imported late

    record_outside_change()


class LimiterStats:
    """This process's counters of store trouble, read by the dashboard and Prometheus.

    ``redis_errors`` counts the store being unavailable (expected: the fail modes handle it);
    ``unexpected_errors`` counts every other exception that escaped a decision (a bug or a
    library incompatibility: see process/unexpected.py), also per exception type name
    (``unexpected_by_type``, bounded like the log's types).
    """

    def __init__(self):
        self.redis_errors = 0
        self.breaker_skips = 0
        self.last_error = ""
        self.last_error_at = None
        self.last_latency_ms = None
        self.unexpected_errors = 0
        self.unexpected_by_type = {}
        self.last_unexpected_type = ""
        self.last_unexpected_message = ""
        self.last_unexpected_at = None

    def count_unexpected(self, error):
        """Count ``error``, an unexpected exception on the decision path. (No lock, as for
        ``redis_errors``: two threads at once may lose a count, never the fact.)"""
        label = type_label(error, self.unexpected_by_type)
        self.unexpected_by_type[label] = self.unexpected_by_type.get(label, 0) + 1
        self.unexpected_errors += 1
        self.last_unexpected_type = type(error).__name__
        self.last_unexpected_message = error_text(error)
        self.last_unexpected_at = time.time()


class Peek:
    """A read-only look at the buckets a request would be charged against.

    ``buckets`` is None when the caller is exempt or denied by a list (``listed``);
    ``statuses`` (in the buckets' order) is None
    when the store could not be read, and ``error`` then says why.
    """

    __slots__ = ("identity", "endpoint", "cost", "buckets", "statuses", "allowed", "error",
                 "listed")

    def __init__(self, identity, endpoint, cost, buckets, statuses=None, allowed=True, error="",
                 listed=None):
        self.identity, self.endpoint, self.cost = identity, endpoint, cost
        self.buckets, self.statuses, self.allowed, self.error = buckets, statuses, allowed, error
        self.listed = listed  # the allow- or deny-list entry that matched, or None


class _Pending(NamedTuple):
    """A decision between its pure steps and the store's answer."""

    snapshot: object
    identity: object
    endpoint: str
    cost: int
    buckets: tuple       # engine.PlannedBuckets
    deny_cache: object   # the DenyCache to learn from the answer, or None
    sent_at: float | None
    minimum: int | None  # a metered endpoint's minimum charge; None: not metered

    def metered(self, decision):
        """Return ``decision``, with the Meter its request reports to if it is an allowed
        request of a metered endpoint."""
        if self.minimum is None or not decision.allowed:
            return decision
        settled = engine.settled_buckets(self.buckets)
        if not settled:
            return decision  # only endpoint rules (they count calls): nothing to settle
        return decision._replace(meter=Meter(tuple(settled), self.cost, self.minimum,
                                             self.snapshot.has_alerts))

    def degraded(self):
        """The Decision while the store cannot answer (the rules' fail modes)."""
        return engine.degraded_decision(self.buckets, self.identity, self.endpoint, self.cost)


_new_pending = tuple.__new__


class Limiter:
    """Decide requests against the quotas in ``store``. ``config`` is the RATELIMIT_APP mapping
    (``conf.get_config()``); ``clock`` a SystemClock or a test clock. ``metrics_autostart``
    starts the background threads when they have work (the metrics flush, the alerts' drain,
    the comparison of the quota rows); tests pass False and run that work themselves (the
    comparison then runs in the request that finds it due)."""

    def __init__(self, config, store, clock=None, *, metrics_autostart=True):
        self.config = config
        self.store = store
        self.clock = clock or SystemClock()
        # time.monotonic itself when the clock is real: read several times per decision, and
        # SystemClock.monotonic would add a Python call each time
        monotonic = time.monotonic if type(self.clock) is SystemClock else self.clock.monotonic
        # the wall clock (unix s) of dated overrides, metrics, usage days and alert periods: a
        # test clock's time while it sets one (so a test's usage lands on the test's day)
        wall_time = time.time if type(self.clock) is SystemClock else self.clock.wall_time
        self.wall_time = wall_time  # (when a list entry ends)
        self.breaker = CircuitBreaker(config["BREAKER_FAILURES"], config["BREAKER_COOLDOWN_S"],
                                      clock=monotonic)
        self.versions = ConfigVersions(store, config["KEY_PREFIX"], self._guarded,
                                       lead_s=publish_lead_s(config))
        self.version_key = self.versions.key
        self.stats = LimiterStats()
        self.unexpected_log = UnexpectedErrorLog(clock=monotonic)
        self.policies = PolicyCache(self.read_version,
                                    check_interval_s=config["CONFIG_CHECK_INTERVAL_S"],
                                    clock=monotonic,
                                    reload_interval_s=reload_interval_s(config),
                                    announce=self._announce_noticed_change,
                                    wall_clock=wall_time,
                                    noticed=_record_outside_change,
                                    in_threads=metrics_autostart,
                                    watch_interval_s=watch_interval_s(config),
                                    poll_version=self.versions.poll,
                                    changes_since=self.versions.changes_since,
                                    superseded=self._forget_local_decisions,
                                    newest_recorded=self.versions.newest_recorded)
        # RATELIMIT_APP["ENABLED"]: False lets every request through undecided (runtime/guard.py)
        self.enabled = bool(config["ENABLED"])
        # tests and benchmarks: say on each response which config version decided it
        self.expose_version = config["EXPOSE_CONFIG_VERSION"]
        # metered costs are settled after the response, which only QuotaMiddleware sees:
        # without it a metered endpoint is charged its estimate
        self.meters = quota_middleware_installed()
        self.deny_cache = DenyCache(clock=monotonic) if config["LOCAL_DENY_CACHE"] else None
        self.leases = Leases(config["LEASE_TTL_S"], clock=monotonic)
        self.recorder = metrics.Recorder(clock=wall_time, config=lambda: self.config)
        # the flush goes straight to the store: a failing flush never opens the breaker above
        self.flusher = metrics.Flusher(self.recorder, client_provider=store.metrics_client,
                                       config=lambda: self.config,
                                       request_errors=lambda: self.stats.redis_errors,
                                       unexpected=self.unexpected_error,
                                       before_flush=self._before_flush)
        self.flusher.autostart = metrics_autostart
        # decisions are counted in batches while a later decision waits for Redis (recorder.py)
        store.run_while_waiting(self._count_metrics_while_waiting)
        self.reader = metrics.Reader(store.metrics_client, config=lambda: self.config)
        # threshold crossings seen in decisions, stored by a background thread
        # (business/alerts/crossings.py)
        self.alerts = AlertQueue(lambda: int(wall_time() * 1000),
                                 config=lambda: self.config, autostart=metrics_autostart)
        # X-Forwarded-For from an address not in TRUSTED_PROXIES: warned of once
        self.untrusted_forwarding = UntrustedForwarding(wall_time)
        # the failed-auth gate, response counting and the penalty box (runtime/protection.py)
        self.protection = Protection(self)

    @classmethod
    def from_settings(cls, clock=None, *, metrics_autostart=True):
        """Return a Limiter built from the current settings."""
        config = get_config()
        return cls(config, build_store(config), clock, metrics_autostart=metrics_autostart)

    def start_watching(self):
        """Start watching the config now rather than at the first decision (what a server's
        middleware does when it is loaded): see PolicyCache.start_watching."""
        self.policies.start_watching()

    def close(self):
        """Stop this Limiter's background threads and close the connections its store opened
        itself."""
        self.flusher.stop()
        self.alerts.stop()
        self.protection.ban_log.stop()
        self.policies.close()
        self.store.close()

    def record(self, decision):
        """Count one decision for the dashboard (in process; flushed by a background thread)."""
        if not self.config["METRICS_ENABLED"]:
            return
        if self.recorder.record(decision):  # once per counted batch or flush
            self._start_flushing()

    def _before_flush(self):
        """What the metrics flush thread does before each flush: read the replies of settles
        sent without waiting, and publish a sighting of untrusted forwarding (forwarding.py)."""
        self.store.collect_unanswered()
        self.untrusted_forwarding.publish(self.store.metrics_client, self.config["KEY_PREFIX"])

    def _start_flushing(self):
        """Start the metrics flush thread if it may run here and does not: besides the counts,
        it reads the replies of settles sent without waiting (Flusher.before_flush)."""
        flusher = self.flusher
        if flusher.autostart and not flusher.running:
            flusher.ensure_running()

    def _count_metrics_while_waiting(self):
        """What the store runs while a decision waits for its reply (see Store.run_while_waiting)."""
        try:
            self.recorder.count_queued_now()
        except Exception as error:  # a fault in counting must not fail the decision waiting
            self.unexpected_error(error, "counting decisions for the metrics")

    def unexpected_error(self, error, action):
        """Count ``error``, an exception other than StoreUnavailable that escaped ``action``
        (e.g. "deciding a request; request allowed"), and log it (at most one traceback per
        exception type a minute). The adapters call this; they never let ``error`` through."""
        self.stats.count_unexpected(error)
        self.unexpected_log.report(error, action)

    # --- the request path --------------------------------------------------------------------

    def snapshot(self):
        """Return the current policy snapshot (reloaded when the config version changed)."""
        return self.policies.get()

    def decide(self, request, user, endpoint, *, now_ms=None):
        """Decide one request and debit its buckets if it is allowed. Returns a Decision.

        ``user`` is the authenticated user (or None); ``endpoint`` the URL name of the view.
        ``now_ms`` (tests only) overrides the clock for this call and keeps the deny cache out.
        A debit refused by the fence (the rules were superseded meanwhile) is decided again on
        fresh rules.
        """
        snapshot, fence = self.policies.get(), None
        for _ in range(FENCED_ATTEMPTS):
            try:
                decision = self._decide_on(snapshot, request, user, endpoint, now_ms, fence)
            except SupersededRules as superseded:
                snapshot, fence = self._next_attempt(
                    snapshot, self._fresher_snapshot(snapshot, superseded.version))
                continue
            # (the test-only name asked for here: no call per decision otherwise)
            return self._named(decision, snapshot) if self.expose_version else decision
        return self._superseded_too_often(snapshot, request, user, endpoint)

    @staticmethod
    def _next_attempt(snapshot, fresher):
        """Return the rules and the fence of the attempt after a fenced one, ``fresher`` being
        what ``_fresher_snapshot`` gave."""
        if fresher is None:
            return snapshot, engine.NO_FENCE  # no newer rules to be had: these, unfenced
        return fresher, None

    def _named(self, decision, snapshot):
        """Return ``decision``, naming the version of ``snapshot`` with EXPOSE_CONFIG_VERSION."""
        if self.expose_version:
            return decision._replace(config_version=snapshot.version)
        return decision

    def _decide_on(self, snapshot, request, user, endpoint, now_ms, fence=None):
        """``decide`` on the rules of ``snapshot``, the debit fenced on their version (or on
        ``fence``, see ``take``); raises SupersededRules when the fence refused it."""
        pending = self._prepare(snapshot, request, user, endpoint, now_ms)
        if isinstance(pending, Decision):
            return pending  # exempt, unlimited, or refused from the deny cache: no Redis call
        if pending.buckets.takes_slot:
            return self._decide_with_slot(pending, now_ms, fence)
        try:
            if pending.buckets.leases:
                allowed, statuses = self._take_with_leases(
                    pending.buckets, pending.snapshot.version, now_ms, fence)
            else:
                reply = self.take(pending.buckets, now_ms=now_ms, fence=fence)
                allowed, statuses = reply.allowed, engine.reply_statuses(pending.buckets, reply)
        except StoreUnavailable:
            return pending.degraded()
        return self._conclude(pending, allowed, statuses)

    def _fresher_snapshot(self, snapshot, store_version):
        """Return rules to decide again on after the fence found ``store_version`` in the store
        instead of ``snapshot``'s version: newer rules; or the same ones, on a Cluster whose
        copies of the version were mended (see config/versions.py); or None when no newer rules can
        be compiled now (the database is down): the rules in force stay so, unfenced."""
        same_rules, label = self.versions.after_fence(snapshot.version, store_version)
        if same_rules:
            return snapshot
        fresher = self.policies.fresh(snapshot, label)
        return None if fresher.version == snapshot.version else fresher

    def _superseded_too_often(self, snapshot, request, user, endpoint):
        """The Decision when the fence refused every attempt (the version changed during each
        compile): the rules' fail modes, as when Redis cannot answer."""
        logger.warning("ratelimit_app: the config version changed during each of %d attempts "
                       "to decide a request; decided by the rules' fail modes",
                       FENCED_ATTEMPTS)
        pending = self._prepare(snapshot, request, user, endpoint, None)
        return self._named(pending if isinstance(pending, Decision) else pending.degraded(),
                           snapshot)

    def _prepare(self, snapshot, request, user, endpoint, now_ms):
        """The steps of a decision before the store: return a Decision when no call is needed,
        else the _Pending decision to send."""
        identity = identify(request, user, snapshot)
        # (the header tested here, not in observe: nearly every request sends none, and then
        # costs no call)
        if self.untrusted_forwarding.seen is None and request.META.get("HTTP_X_FORWARDED_FOR"):
            self.untrusted_forwarding.observe(request.META)
        if snapshot.access_lists is not None:
            screening = screen(snapshot, request, identity, endpoint, self.wall_time)
            if screening is not None:
                if screening.decision is not None:
                    return screening.decision  # denied, or trusted and exempt: no Redis call
                identity = screening.identity  # trusted
        cost = engine.request_cost(snapshot, request, endpoint, identity.plan)
        buckets = engine.plan_buckets(snapshot, identity, endpoint, cost)
        if buckets is None:
            return Decision(allowed=True, identity=identity, endpoint=endpoint, cost=cost,
                            exempt=True)
        if not buckets:
            return Decision(allowed=True, identity=identity, endpoint=endpoint, cost=cost)
        deny_cache = self.deny_cache if now_ms is None else None
        sent_at = None
        if deny_cache is not None:
            cached = deny_cache.lookup(buckets, snapshot.version)
            # (a refusal without Redis is not fenced: only while the version is confirmed)
            if cached is not None and self.policies.confirmed_recently():
                return engine.decision_from(buckets, cached, False, identity, endpoint,
                                            cost)._replace(from_deny_cache=True)
            sent_at = deny_cache.now()
        # positionally, without the NamedTuple's Python-level __new__ (one per decision)
        minimum = snapshot.minimum_if_metered(endpoint, request.method, identity.plan) \
            if snapshot.metering and self.meters else None
        return _new_pending(_Pending, (snapshot, identity, endpoint, cost, buckets, deny_cache,
                                       sent_at, minimum))

    def _conclude(self, pending, allowed, statuses):
        """The steps of a decision after the store answered: learn, and build the Decision."""
        if pending.deny_cache is not None:
            # the snapshot's version, not the reply's: the levels are only a valid bound for
            # the rules these buckets were built from
            pending.deny_cache.learn(pending.buckets, statuses, allowed,
                                     pending.snapshot.version, pending.sent_at)
        if allowed and pending.snapshot.has_alerts:
            self.alerts.note(pending.buckets, statuses, pending.identity)
        decision = engine.decision_from(pending.buckets, statuses, allowed, pending.identity,
                                        pending.endpoint, pending.cost)
        return decision if pending.minimum is None else pending.metered(decision)

    def _decide_with_slot(self, pending, now_ms, fence=None):
        """``decide`` for a request one of whose buckets is a concurrency limit: the same one
        take.lua call, carrying a new slot id; an allowed decision holds the slot
        (``Decision.slot``) until ``release_slot``. Leases are not used for such a request (its
        buckets are all debited in Redis), and the deny cache does not learn from it (a slot
        frees when a response finishes, not at a refill time)."""
        buckets = pending.buckets
        slot_id = secrets.randbits(63)
        try:
            reply = self.take(buckets, now_ms=now_ms, slot_id=slot_id, fence=fence)
        except StoreUnavailable:
            return pending.degraded()
        statuses = engine.statuses_from(buckets, reply)
        decision = engine.decision_from(buckets, statuses, reply.allowed, pending.identity,
                                        pending.endpoint, pending.cost)
        if reply.allowed and pending.snapshot.has_alerts:
            self.alerts.note(buckets, statuses, pending.identity)
        if reply.allowed:
            held = tuple(b.key for b, result in zip(buckets, reply.results)
                         if result == 1 and _takes_slot(b))
            if held:
                decision = decision._replace(slot=(held, slot_member(slot_id)))
        return pending.metered(decision)

    def settle(self, buckets, extra, *, now_ms=None):
        """Charge ``buckets``, those a request was debited on, ``extra`` tokens more than its
        admission debit (negative: give them back), once its real cost is known: one settle.lua
        call (one per slot group on a Cluster), down to each rule's debt bound. Returns the
        settled buckets' statuses after it, or None when there was nothing to settle or the
        store could not be told (logged; the request then stays charged its admission debit).
        ``now_ms`` is for tests only."""
        settled = engine.settled_buckets(buckets) if extra else ()
        reply = self.settle_units(settled, extra, now_ms) if settled else None
        return None if reply is None else _statuses_at(settled, [level for level, _ in reply])

    def settle_metered(self, decision):
        """Settle the request of ``decision``, a metered one (``decision.meter``), once its
        response is finished: charge its buckets what it reported instead of its estimate,
        count it in the metrics and usage at that cost, and note the alert thresholds its
        settle reached. Runs once per request (later calls do nothing).

        The settle.lua call is sent, not waited for (Store.settle_later): Redis applies it as
        it arrives, and what needs its reply (the count at the settled cost, a credit
        balance's charge, the alert thresholds) is done once the reply is read: before the
        connection's next decision, with other settles' replies, or at the latest at the next
        metrics flush (HeldConnections.send_unanswered)."""
        meter = decision.meter
        extra = meter.close()
        if extra is None:
            return
        if not extra:
            self.record(decision)
            return

        self.settle_units_later(meter.buckets, extra,
                                lambda reply: self._note_settled(decision, extra, reply))

    def settle_units_later(self, settled, extra, on_settled):
        """``settle_units`` without waiting for Redis's reply (Store.settle_later):
        ``on_settled`` gets what ``settle_units`` returns once the reply is read (at once when
        nothing could be sent), in whichever thread reads it."""
        def settled_reply(reply):
            try:
                if isinstance(reply, StoreUnavailable):
                    self._store_failed(reply)
                    reply = self._not_settled(reply)
                on_settled(reply)
            except Exception as error:  # it runs in another request's call: never fail that
                self.unexpected_error(error, "counting a settled request")

        now_ms = self.clock.redis_now_ms()  # a test clock's time, as take's; else None
        try:
            self._guarded(self.store.settle_later, *engine.settle_args(settled, extra, now_ms),
                          settled_reply)
        except StoreUnavailable as exc:
            on_settled(self._not_settled(exc))
            return
        # the reply is read by the flush at the latest, which then must run: a settle is
        # counted only once read, and metrics may be off, so no decision may have started it
        self._start_flushing()
        if extra < 0 and self.deny_cache is not None:
            self.deny_cache.forget(settled)  # (see settle_units)

    def _note_settled(self, decision, extra, reply):
        """Count the settled request of ``decision`` at its cost, and note the alert
        thresholds its settle reached (``reply``: Store.settle's, or None when the store
        could not be told)."""
        meter = decision.meter
        self.record(settled_decision(decision, meter, extra, reply))
        if reply is not None and meter.alerts and extra > 0:
            # every bucket took ``extra``: none is short of it (a bucket emptied, or in debt,
            # has reached 100 %)
            statuses = tuple([bucket.status(level, False)
                              for bucket, (level, _) in zip(meter.buckets, reply)])
            self.alerts.note(meter.buckets, statuses, decision.identity, tokens=extra)

    async def asettle(self, buckets, extra, *, now_ms=None):
        """``settle`` for an event loop: the store's call runs in a worker thread."""
        return await sync_to_async(self.settle, thread_sensitive=False)(
            buckets, extra, now_ms=now_ms)

    def settle_units(self, settled, extra, now_ms=None):
        """settle.lua on ``settled`` (buckets ``engine.settled_buckets`` kept); return its
        ``(level, charged)`` per bucket (Store.settle), or None when the store could not be
        told (logged)."""
        if now_ms is None:
            now_ms = self.clock.redis_now_ms()  # a test clock's time, as take's; else None
        try:
            reply = self._guarded(self.store.settle,
                                  *engine.settle_args(settled, extra, now_ms))
        except StoreUnavailable as exc:
            return self._not_settled(exc)
        if extra < 0 and self.deny_cache is not None:
            # levels rose by more than the refill: what the cache remembers no longer bounds them
            self.deny_cache.forget(settled)
        return reply

    @staticmethod
    def _not_settled(exc):
        logger.warning("ratelimit_app: a request's cost was not settled (%s); it stays charged "
                       "its admission debit", exc)
        return None

    def release_slot(self, decision):
        """Release the concurrency slot ``decision`` holds (one release.lua call; idempotent:
        a second release, or one after the slot's deadline, removes nothing). Returns True if
        the store answered; a failure is logged, and the slot then frees at its deadline."""
        if decision.slot is None:
            return True
        slot_keys, member = decision.slot
        try:
            self._guarded(self.store.release, slot_keys, member)
        except StoreUnavailable as exc:
            logger.warning("ratelimit_app: a concurrency slot was not released (%s); it frees "
                           "at its deadline", exc)
            return False
        return True

    def _take_with_leases(self, buckets, version, now_ms, fence=None):
        """``take`` for a decision some of whose buckets lease tokens (see decision/leases.py).
        Returns ``(allowed, statuses)``, statuses in the buckets' order."""
        leases = self.leases
        plan = leases.plan(buckets, version)
        fence = version if fence is None else fence
        allowed, reply = True, None
        try:
            if plan.send:
                reply = self.take(plan.send, now_ms=now_ms, fence=fence)
                if not reply.allowed and _lease_was_too_much(plan, buckets, reply):
                    # the bucket holds this request's cost but not a lease as well: no lease
                    plan = leases.without_leasing(plan, buckets)
                    reply = self.take(plan.send, now_ms=now_ms, fence=fence)
                allowed = reply.allowed
        except (StoreUnavailable, SupersededRules):
            leases.settle(plan, buckets, False, version)
            raise
        leases.settle(plan, buckets, allowed, version)
        statuses = [None] * len(buckets)
        for j, i in enumerate(plan.sent):
            bucket, level = buckets[i], reply.levels[j]
            # short against this request's cost, not the cost plus a lease
            statuses[i] = bucket.status(level, reply.results[j] == -1 and
                                        level < bucket.cost_units)
        for i in plan.local:
            # the bucket's level is not known here; its capacity is a safe upper bound for the
            # deny cache, and shared buckets' levels are not shown to clients anyway
            statuses[i] = buckets[i].status(buckets[i].capacity_units, False)
        return allowed, tuple(statuses)

    # --- the request path on an asyncio event loop (QuotaMiddleware under ASGI) --------------

    # built on first use by async_store(); set by adecide while a thread refreshes the snapshot
    _async_store = None
    _refreshing_snapshot = False

    async def adecide(self, request, user, endpoint, *, now_ms=None):
        """``decide`` for an event loop: the same steps, with the store call awaited on the
        async store (see stores/aio.py). Returns a Decision."""
        # the snapshot in memory without a coroutine of its own (nearly every request)
        snapshot = self.policies.current()
        if snapshot is None:
            snapshot = await self.asnapshot()
        fence = None
        for _ in range(FENCED_ATTEMPTS):
            try:
                decision = await self._adecide_on(snapshot, request, user, endpoint, now_ms,
                                                  fence)
            except SupersededRules as superseded:
                # the compile, if any, in a thread (the ORM's rule: thread_sensitive)
                snapshot, fence = self._next_attempt(snapshot, await sync_to_async(
                    self._fresher_snapshot)(snapshot, superseded.version))
                continue
            # (the test-only name asked for here: no call per decision otherwise)
            return self._named(decision, snapshot) if self.expose_version else decision
        return self._superseded_too_often(snapshot, request, user, endpoint)

    async def _adecide_on(self, snapshot, request, user, endpoint, now_ms, fence=None):
        """``_decide_on`` for an event loop."""
        pending = self._prepare(snapshot, request, user, endpoint, now_ms)
        if isinstance(pending, Decision):
            return pending  # exempt, unlimited, or refused from the deny cache: no Redis call
        if pending.buckets.takes_slot:
            # a concurrency limit (rare, and its release is sync anyway): the sync path in a
            # worker thread
            return await sync_to_async(self._decide_with_slot, thread_sensitive=False)(
                pending, now_ms, fence)
        try:
            # (a snapshot that leases for some rules still sends the other requests straight to
            # the async store)
            if pending.buckets.leases:
                # leases may need a second call and keep local state between the two: the sync
                # path in a worker thread (hot shared buckets only; most of their requests are
                # then served from the lease without any call)
                allowed, statuses = await sync_to_async(
                    self._take_with_leases, thread_sensitive=False)(
                    pending.buckets, pending.snapshot.version, now_ms, fence)
            else:
                reply = await self.atake(pending.buckets, now_ms=now_ms, fence=fence)
                allowed, statuses = reply.allowed, engine.reply_statuses(pending.buckets, reply)
        except StoreUnavailable:
            return pending.degraded()
        return self._conclude(pending, allowed, statuses)

    async def asnapshot(self):
        """``snapshot()`` for an event loop. Nearly always the snapshot in memory, with no
        I/O; when the version is due for its poll or the rules for a reload (the database), that
        work runs in a thread (Django's ORM rule: ``thread_sensitive``), once: requests arriving
        meanwhile keep the rules in memory rather than queue behind it."""
        policies = self.policies
        snapshot = policies.current()
        if snapshot is not None:
            return snapshot
        if self._refreshing_snapshot and policies.snapshot is not None:
            return policies.snapshot
        self._refreshing_snapshot = True
        try:
            return await sync_to_async(policies.get)()
        finally:
            self._refreshing_snapshot = False

    async def atake(self, buckets, *, now_ms=None, debit=True, fence=None):
        """``take`` awaited on the async store, through the same breaker and counters as
        ``_guarded`` (written out here rather than as a coroutine wrapping the store's: one
        coroutine less per decision). Returns the TakeReply; raises StoreUnavailable and
        SupersededRules."""
        bucket_keys, args = self._take_call(buckets, now_ms, debit, 0, fence)
        breaker = self.breaker
        if not breaker.allow_call():
            self.stats.breaker_skips += 1
            raise StoreUnavailable("circuit breaker open")
        started = time.perf_counter()
        try:
            try:
                reply = await self.async_store().take(bucket_keys, args,
                                                      version_key=self.version_key)
            except BalancesMissing as missing:  # rare: seeded in a thread (the ORM's rule)
                await sync_to_async(self.seed_balances)(buckets, missing.positions)
                try:
                    reply = await self.async_store().take(bucket_keys, args,
                                                          version_key=self.version_key)
                except BalancesMissing as again:
                    raise StoreUnavailable("credit balances missing after their seed") \
                        from again
        except StoreUnavailable as exc:
            self._store_failed(exc)
            raise
        except (SupersededRules, BalancesMissing):
            breaker.record_success()  # the store answered
            raise
        breaker.record_success()
        self.stats.last_latency_ms = (time.perf_counter() - started) * 1000
        self.policies.observe_version(reply.version)
        return reply

    def async_store(self):
        """Return the async store beside ``store`` (built on first use)."""
        store = self._async_store
        if store is None:
            from ..stores.aio import async_store_for

            store = self._async_store = async_store_for(self.store)
            store.run_while_waiting(self._count_metrics_while_waiting)
        return store

    # --- read-only looks and operator actions ------------------------------------------------

    def peek(self, request, user, endpoint, *, identity=None, now_ms=None):
        """Return a Peek: the buckets ``request`` would be charged against and their levels
        now. Nothing is debited, nothing is counted. ``identity`` replaces the one the request
        would give (the simulator's stand-in API key)."""
        snapshot = self.policies.get()
        identity = identity or identify(request, user, snapshot)
        screening = screen(snapshot, request, identity, endpoint, self.wall_time) \
            if snapshot.access_lists is not None else None
        if screening is not None:
            identity, decision = screening.identity, screening.decision
            if decision is not None:
                return Peek(identity, endpoint, decision.cost, None, statuses=(),
                            allowed=decision.allowed, listed=screening.entry)
        cost = engine.request_cost(snapshot, request, endpoint, identity.plan)
        buckets = engine.plan_buckets(snapshot, identity, endpoint, cost)
        listed = screening.entry if screening is not None else None
        if not buckets:
            return Peek(identity, endpoint, cost, buckets, statuses=(), listed=listed)
        try:
            statuses, allowed = self.peek_buckets(buckets, now_ms=now_ms)
        except StoreUnavailable as exc:
            return Peek(identity, endpoint, cost, buckets,
                        allowed=not engine.refusing_without_redis(buckets),
                        error=str(exc) or "no answer", listed=listed)
        return Peek(identity, endpoint, cost, buckets, statuses, allowed, listed=listed)

    def peek_buckets(self, buckets, *, now_ms=None):
        """Return ``(statuses, allowed)`` of ``buckets`` now, debiting nothing. Raises
        StoreUnavailable."""
        reply = self.take(buckets, now_ms=now_ms, debit=False)
        return engine.statuses_from(buckets, reply), reply.allowed

    def reset(self, bucket_keys):
        """Delete ``bucket_keys`` (one client's own buckets: one hash tag, so one call even on a
        cluster) and announce a new config version, so every worker drops its local denials.
        Returns ``(keys deleted, new version)``; raises StoreUnavailable."""
        deleted = self._guarded(self.store.delete, bucket_keys)
        return deleted, self.bump_config_version(parts=())  # no rows changed

    # --- the config version ------------------------------------------------------------------

    def read_version(self):
        """Return the config version in the store ("0" when unset). Raises StoreUnavailable."""
        return self.versions.read()

    def _forget_local_decisions(self):
        """A newer config version is published: drop the denials learnt on the old rules, so
        no request is refused without Redis on them (leases are kept per version already).
        A watcher that lags (a busy machine) cannot do this in time: the deny cache answers
        only while the version was confirmed moments ago (PolicyCache.confirmed_recently)."""
        if self.deny_cache is not None:
            self.deny_cache.clear()

    def bump_config_version(self, parts=None):
        """Give the config version a value never used before, so every worker reloads; return it.
        ``parts``: the model names of the tables the edit changed (None: unknown, every worker
        compiles everything; empty: none, the workers only take the new version).

        Workers reload whenever the version differs from their snapshot's, so a bump only has
        to be new (see config/versions.py). This process reloads at once. Raises StoreUnavailable.
        """
        self.policies.invalidate(parts)
        return self.versions.publish(parts)

    def _announce_noticed_change(self, superseded, parts=None):
        """Tell every worker to reload: what the comparison of the rows does when it finds the
        rows of version ``superseded`` changed. Several workers may find the same change: the
        first to claim it announces it, and only it returns True (it records the change in the
        audit trail). Unlike ``bump_config_version``, this process's snapshot is left to the
        comparison, which marks it stale for the watcher to compile."""
        if not self.versions.claim_change(superseded):
            return False
        # (no lead: this worker holds its compile's lock meanwhile, see PolicyCache)
        self.versions.publish(parts, lead=False)
        return True

    # --- the store, through the breaker ------------------------------------------------------

    def take(self, buckets, *, now_ms=None, debit=True, slot_id=0, fence=None):
        """Run take.lua for ``buckets`` through the breaker and return the store's TakeReply
        (the config version it carried is noted). ``slot_id`` names the slot of a concurrency
        limit among them. A debit is fenced on ``fence``, or on the version planned buckets
        were compiled from (engine.PlannedBuckets). Raises StoreUnavailable, and
        SupersededRules when the fence refused it."""
        bucket_keys, args = self._take_call(buckets, now_ms, debit, slot_id, fence)
        try:
            reply = self._guarded(self.store.take, bucket_keys, args,
                                  version_key=self.version_key)
        except BalancesMissing as missing:
            self.seed_balances(buckets, missing.positions)
            try:
                reply = self._guarded(self.store.take, bucket_keys, args,
                                      version_key=self.version_key)
            except BalancesMissing as again:  # deleted again at once: no answer to be had
                raise StoreUnavailable("credit balances missing after their seed") from again
        self.policies.observe_version(reply.version)
        return reply

    def seed_balances(self, buckets, positions):
        """Give the credit balances among ``buckets`` at ``positions`` (take.lua found them
        missing: their first use, or Redis lost them) their value from the ledger, unless
        another worker did first. Raises StoreUnavailable when the ledger or the store cannot
        answer (the decision then follows the rules' fail modes)."""
        from ..business.credits.ledger import seed

        accounts = sorted({buckets[i].account for i in positions})
        try:
            seed(self.store.metrics_client(), self.config["KEY_PREFIX"], accounts)
        except Exception as exc:  # the database or Redis: no balance, no decision on it
            raise StoreUnavailable(f"credit balances not seeded: {exc}") from exc

    def _take_call(self, buckets, now_ms, debit, slot_id=0, fence=None):
        """Return take.lua's ``(keys, args)`` for ``buckets``."""
        if now_ms is None:
            now_ms = self.clock.redis_now_ms()
        if now_ms is None and debit and not slot_id and fence is None:
            # the common call, a debit on the Redis clock: built once, when the buckets were
            # planned (engine.PlannedBuckets; None when an argument depends on the moment)
            args = getattr(buckets, "debit_args", None)
            if args is not None:
                return buckets.keys, args
        if fence is None:
            fence = getattr(buckets, "version", None)
        return [b.key for b in buckets], engine.take_args(buckets, now_ms, debit, slot_id, fence)

    def _guarded(self, operation, *args, **kwargs):
        """Run a store operation of the request path through the breaker; count failures."""
        breaker, stats = self.breaker, self.stats
        if not breaker.allow_call():
            stats.breaker_skips += 1
            raise StoreUnavailable("circuit breaker open")
        started = time.perf_counter()
        try:
            result = operation(*args, **kwargs)
        except StoreUnavailable as exc:
            self._store_failed(exc)
            raise
        except (SupersededRules, BalancesMissing):
            breaker.record_success()  # the store answered
            raise
        breaker.record_success()
        stats.last_latency_ms = (time.perf_counter() - started) * 1000
        return result

    def _store_failed(self, exc):
        """Count a failed store call of the request path (sync or async) and log it."""
        breaker, stats = self.breaker, self.stats
        breaker.record_failure()
        stats.redis_errors += 1
        stats.last_error, stats.last_error_at = str(exc), time.time()
        if is_misconfiguration(exc):
            # Redis answers but refuses what the limiter sends: no wait will cure it
            logger.error("ratelimit_app: the store is misconfigured, not down: %s (a %s "
                         "store; run manage.py check); breaker %s", exc, self.store.kind,
                         breaker.state)
        else:
            logger.warning("ratelimit_app: Redis unavailable (%s); breaker %s", exc,
                           breaker.state)


def _statuses_at(buckets, levels):
    """Return the statuses of ``buckets`` holding ``levels`` (a settle's reply)."""
    return tuple([bucket.status(level, level < bucket.cost_units)
                  for bucket, level in zip(buckets, levels)])


def settled_decision(decision, meter, extra, reply):
    """Return ``decision`` as the metrics and usage count it once settled: its cost the
    meter's, each bucket ``extra`` more, but a credit balance what the settle charged it
    (``reply``: Store.settle's, or None when it did not reach the store; a balance cut at its
    debt bound is billed what it paid, never what the request reported)."""
    if not extra:
        return decision
    added = {}
    for index, bucket in enumerate(meter.buckets):
        if isinstance(bucket, CreditBalance):
            added[bucket.rule.name] = reply[index][1] if reply is not None else 0
        else:
            added[bucket.rule.name] = extra
    policies = tuple([status._replace(cost=status.cost + added[status.name])
                      if status.name in added else status for status in decision.policies])
    return decision._replace(cost=decision.cost + extra, policies=policies)


def _takes_slot(bucket):
    return isinstance(bucket, ConcurrencySlot)


def _lease_was_too_much(plan, buckets, reply):
    """True if a bucket asked for a lease was short of the lease but held the request's cost."""
    position = {i: j for j, i in enumerate(plan.sent)}
    return any(reply.results[position[i]] == -1 and
               reply.levels[position[i]] >= buckets[i].cost_units for i in plan.leasing)


class _DefaultLimiter:
    """Holds the process's Limiter: built on first use, forgotten when settings change."""

    def __init__(self):
        self._lock = threading.Lock()
        self.limiter = None
        # how to build the next one; a test's choices survive settings changes
        self.clock = None
        self.metrics_autostart = True

    def get(self):
        limiter = self.limiter
        if limiter is None:
            with self._lock:
                if self.limiter is None:
                    self.limiter = Limiter.from_settings(
                        self.clock, metrics_autostart=self.metrics_autostart)
                    process_clock.use(self.limiter.clock)
                limiter = self.limiter
        return limiter

    def replace(self, limiter):
        """Install ``limiter`` (None: build anew on next use); stop the one it replaces."""
        with self._lock:
            old, self.limiter = self.limiter, limiter
            # the clock the next decisions follow: this one's, or the one the next is built with
            process_clock.use(limiter.clock if limiter is not None else self.clock)
        if old is not None and old is not limiter:
            old.close()


_default = _DefaultLimiter()


def default_limiter():
    """Return the process's Limiter (built from settings on first use)."""
    return _default.limiter or _default.get()


def install_limiter(limiter=None, *, clock=None, metrics_autostart=True):
    """Make ``limiter`` the process's Limiter (None: build one from settings on next use, with
    ``clock`` and ``metrics_autostart``). Tests use this; production code never needs to."""
    _default.clock, _default.metrics_autostart = clock, metrics_autostart
    _default.replace(limiter)


def forget_default_limiter(**kwargs):
    """``setting_changed`` receiver: rebuild the Limiter from the new settings on next use
    (keeping a test's clock and metrics choice)."""
    if kwargs.get("setting") in (None, "RATELIMIT_APP", "CACHES", "MIDDLEWARE"):
        _default.replace(None)
