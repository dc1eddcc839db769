"""``PolicyCache``: the snapshot in force in this process, kept fresh as the configuration changes.

The request path reads only the snapshot (``snapshot.py``, compiled from the rows by
``compiler.py``): no database query per request once it is warm. Every committed admin change
publishes a new config version in Redis (``runtime/signals.py``). From then on:

- no debit is made on older rules: each take.lua call is fenced on the version its rules were
  compiled from, debits nothing when the store holds another, and the decision is made again
  on fresh rules (``Limiter``; on a Cluster the version is copied into every slot);
- each worker's watcher thread reads the version every ``CONFIG_WATCH_INTERVAL_S`` (one GET)
  and compiles the new rules off the request path (``PolicyCache``), so the fence seldom fires;
- an edit's record of changes precedes its version by ``CONFIG_PUBLISH_LEAD_S``
  (``versions.py``): the watcher, which reads the newest record too, compiles the rules of
  that version ahead and installs them when the version key reaches it, so a request the new
  version fences finds them compiled instead of compiling them.

Rows changed without a signal (a queryset's ``update()``, ``bulk_create``, raw SQL, a data
migration) announce nothing: for them the watcher compares a digest of the rows with its
snapshot's once every ``CONFIG_RELOAD_INTERVAL_S`` (one query, ``fingerprint.py``), and the
first worker to see a difference announces a new version (recorded once in the audit trail).

Plan assignments, identity overrides and the plan of an API key may have a start and an end
(``models.Scheduled``): a snapshot holds only the rows active when it was compiled, and the
next moment one starts or ends (``Snapshot.next_change_at``); the snapshot of that moment is
compiled ahead and swapped in at the moment (``PolicyCache``).
"""
import logging
import math
import os
import threading
import time
from typing import NamedTuple

from ..process.background import WorkerThread
from ..stores.base import StoreUnavailable
from .compiler import RELOAD_PAUSE_S, compile_snapshot
from .fingerprint import COMPARISON_PAUSE_S, changed_rows, config_fingerprint
from .snapshot import Snapshot
from .versions import PUBLICATION_WAIT_S, published_ms

__all__ = ["PolicyCache", "ANNOUNCE_GRACE_S", "SCHEDULE_RECHECK_S", "UPCOMING_LEAD_S"]

logger = logging.getLogger("ratelimit_app")

# How long the watcher waits, once its comparison found the rows changed, for the version an
# edit made through save() publishes after its commit, before it takes the change for one
# made outside the app (announced, and recorded in the audit trail): longer than a
# publication takes (a node: a millisecond; a Cluster's copies: about 0.1 s), short beside
# CONFIG_RELOAD_INTERVAL_S.
ANNOUNCE_GRACE_S = 0.25
ANNOUNCE_GRACE_POLL_S = 0.01

# How long the watcher keeps its database connection between rounds: connecting (and SQLite's
# reading of the schema) costs a worker more CPU than compiling an edit of one row, and every
# worker compiles every edit. One connection per worker, closed at least this often.
WATCHER_CONNECTION_S = 60.0

# The longest a worker trusts its monotonic clock to say when a dated row starts or ends: the
# wall clock is read again after this long (it may have been stepped meanwhile).
SCHEDULE_RECHECK_S = 60.0


# How long before a dated row's moment its snapshot is compiled (see PolicyCache.upcoming): far
# enough ahead that the compile is done when the moment comes, near enough that an edit seldom
# makes it wasted work.
UPCOMING_LEAD_S = 2.0


class _Prepared(NamedTuple):
    """The rules of a version recorded ahead of its publication (see PolicyCache): compiled
    from ``base`` and the rows ``changed`` named, with the digests of those rows."""

    base: Snapshot
    snapshot: Snapshot
    fingerprint: object
    changed: set


class PolicyCache:
    """A process's current snapshot, and how it stays fresh. The Limiter owns one.

    ``read_version`` returns the config version in the store (raising ``StoreUnavailable``
    when it cannot answer); ``load`` compiles a Snapshot of a version (default:
    ``compile_snapshot``, the database); ``clock`` is monotonic seconds, ``wall_clock`` epoch
    seconds (when dated rows start and end).

    Freshness rests on three parts (docs/howto/apply-edits.md says what they guarantee):

    - The fence: every debit carries the version its rules were compiled from, and take.lua
      debits nothing when the store holds another. The Limiter then asks ``fresh()`` for newer
      rules and decides again. So no decision debited in Redis after a version is published is
      made on older rules, even in a process that has not heard of the edit yet.
    - The watcher (``in_threads``, what a Limiter in a server runs): one thread that reads the
      version every ``watch_interval_s`` (one GET) and compiles a new version's rules at once,
      compiles the snapshot of a dated row's moment ahead of it, and compares the rows every
      ``reload_interval_s``, none of it waiting for a request. So the fence seldom fires, and a
      request seldom waits for a compile. A compile reads only the tables the versions since
      the snapshot's changed (``changes_since``, the store's record; see compile_snapshot).
    - Publications ahead (``newest_recorded``: the version of the newest record of changes,
      which an edit writes CONFIG_PUBLISH_LEAD_S before its version): the watcher compiles a
      recorded version's rules from the snapshot and the rows it names (``prepared``), and the
      reload that finds the version key at it installs them, a pointer swap. Decisions stay on
      the snapshot until then: their debits are fenced on the version key alone.
    - Dated rows: a snapshot holds the rows active at its ``compiled_at`` and the next moment
      one starts or ends (``next_change_at``). The snapshot of that moment (``upcoming``) is
      compiled ahead, and swapped in by the first request at or after the moment or by the
      watcher, whichever comes first: a pointer swap, no compile.

    Without ``in_threads`` (tests, with their clocks and transactions) the request that finds
    it due polls the version (every ``check_interval_s``), reloads, compares the rows and
    switches at a dated moment. An edit made in this process (``invalidate()``: the commit of
    an admin save) is compiled in the next request either way, so the process that saved
    serves its edit at once; so is the first load.

    With ``reload_interval_s`` (None: off), the rows are compared with those the snapshot was
    compiled from through ``fingerprint`` (a digest, one query), for edits that send no signal
    (a queryset's ``update()``, raw SQL), one digest per table. On a difference
    ``announce(version, parts)`` writes a new version naming the rows that differ for every
    worker, unless another worker has announced this very change (it returns False then), and
    the worker whose announcement it was calls ``noticed`` (the audit trail's record): one
    record per change.
    """

    def __init__(self, read_version, *, check_interval_s, clock=time.monotonic,
                 load=None, reload_interval_s=None, fingerprint=None, announce=None,
                 wall_clock=time.time, noticed=None, in_threads=False,
                 watch_interval_s=0.05, poll_version=None, changes_since=None,
                 superseded=None, newest_recorded=None):
        self._read_version = read_version
        # the version of the newest record of changes (None: no record), for the watcher
        self._newest_recorded = newest_recorded
        # the watcher's read: straight to the store (its failures are not the requests')
        self._poll_store = poll_version or read_version
        self._poll_failed = False
        # ``changes_since(version, newest)``: the model names of the tables the versions
        # published after ``version`` up to ``newest`` changed (a set), or None when the store
        # cannot say (then everything is read)
        self._changes_since = changes_since
        # called as soon as a newer version is seen, before its compile: what the process
        # decides without Redis (the deny cache) must not outlive the rules (see Limiter)
        self._superseded = superseded
        # until then, a version key older than the snapshot's is a publication under way (the
        # snapshot was compiled as the version of a Cluster copy, see fresh): not a change
        self._ahead_until = 0.0
        # tables this process knows changed (its own edits, its comparison's findings) that no
        # compile has read since; None: unknown, everything
        self._pending_parts = set()
        self._wall_clock = wall_clock
        # the compile and the digest of the rows, when a test gives its own (see _load, _digest)
        self._given_load, self._given_fingerprint = load, fingerprint
        self.check_interval_s = check_interval_s
        self.reload_interval_s = reload_interval_s
        self.watch_interval_s = watch_interval_s
        self._announce = announce
        self._noticed = noticed
        self._clock = clock
        self._lock = threading.Lock()          # one compile at a time
        self._swap_lock = threading.Lock()     # installing a snapshot (never held to compile)
        self._compare_lock = threading.Lock()  # one comparison at a time
        self.snapshot = None
        self.upcoming = None     # the snapshot of snapshot.next_change_at, compiled ahead
        self.prepared = None     # a _Prepared: the rules of a publication under way
        self.fingerprint = None  # digests of the rows the snapshot was compiled from
        self.last_compile = ""   # what the last compile read: "everything", or its parts
        self.prepared_installs = 0  # reloads that installed rules compiled ahead (prepared)
        self.stale = True
        self.checked_at = 0.0  # clock time the version was last confirmed
        self.retry_at = 0.0    # after a failed load: clock time the DB may be tried again
        self.compare_at = math.inf  # clock time the rows are next compared with the snapshot
        self.switch_at = math.inf   # clock time a dated row may start or end (see _schedule)
        self.due_at = math.inf      # what the request path compares with (see _set_due)
        # invalidate() calls so far, and how many of them the last reload covered; and a
        # dated moment passed with no upcoming snapshot ready: both reload in the request
        self._edits_here = self._edits_reloaded = 0
        self._moment_missed = False
        self._watcher = (WorkerThread(self._watch, "ratelimit-config-watcher",
                                      every_s=self._until_next_watch,
                                      keep_connections_s=WATCHER_CONNECTION_S)
                         if in_threads else None)

    def _load(self, version, pause_s=0.0, at=None, base=None, changed=None):
        """Compile the rows into a snapshot of ``version`` as they apply at ``at`` (epoch s;
        default: now), pausing ``pause_s`` between chunks of rows; with ``base``, reading only
        what ``changed`` names (see compile_snapshot)."""
        if self._given_load is not None:
            return self._given_load(version) if at is None else self._given_load(version, at=at)
        return compile_snapshot(version, self._wall_clock() if at is None else at, pause_s,
                                base=base, changed=changed)

    def _digest(self, pause_s=0.0, parts=None):
        """Return the digests of the rows (``config_fingerprint``), pausing as ``_load`` does:
        of every table, or of the changes ``parts`` (tables, rows) patched into the current
        ones."""
        if self._given_fingerprint is not None:
            return self._given_fingerprint()
        if parts is None or not isinstance(self.fingerprint, dict):
            return config_fingerprint(pause_s=pause_s)
        return {**self.fingerprint,
                **config_fingerprint(pause_s=pause_s, parts=parts, base=self.fingerprint)}

    @property
    def watching(self):
        """True while the watcher thread runs (False without ``in_threads``)."""
        return self._watcher is not None and self._watcher.running

    def start_watching(self):
        """Start the watcher now (no-op without ``in_threads``): its first round compiles the
        rules, so a worker watches for edits, outside ones included, from the moment it is
        loaded rather than from its first request, which then finds the rules compiled."""
        if self._watcher is not None:
            self._watcher.wake()

    def close(self):
        """Stop the watcher thread, if it runs."""
        if self._watcher is not None:
            self._watcher.stop()

    def invalidate(self, parts=None):
        """Reload at the next request (in the request, also with ``in_threads``), keeping the
        current rules if the reload fails. ``parts``: what the edit changed, tables or rows as
        ``changes.py`` writes them (None: unknown)."""
        self._note_changed(parts)
        self._edits_here += 1
        self.stale = True

    def _note_changed(self, parts):
        """Remember that the tables or rows of ``parts`` (None: unknown ones) changed."""
        if parts is None or self._pending_parts is None:
            self._pending_parts = None
        else:
            self._pending_parts = self._pending_parts | set(parts)

    @property
    def reload_here(self):
        """True when the next request must compile itself rather than leave it to the watcher:
        after an edit made in this process that no reload has covered yet, or a dated moment
        that passed before its snapshot was ready."""
        return self._edits_here != self._edits_reloaded or self._moment_missed

    def reset(self):
        """Drop the snapshot; the next request compiles a new one."""
        with self._lock:
            self.snapshot = self.upcoming = self.prepared = None
            self.fingerprint = None
            self.stale = True
            self.retry_at = 0.0

    def confirmed_recently(self):
        """True when the store confirmed the snapshot's version within two watcher rounds (with
        no watcher: within ``check_interval_s``): what a decision made without Redis, which
        the fence cannot catch, needs to be made on rules that are still the published ones.
        So a watcher held up by a busy machine delays no edit's effect on local refusals."""
        window = 2 * self.watch_interval_s if self._watcher is not None \
            else self.check_interval_s
        return not self.stale and self._clock() - self.checked_at <= window

    def observe_version(self, version):
        """Record the config version a store reply carried (None: the reply had none); any
        difference from the snapshot's, up or down, makes the snapshot stale."""
        if version is None:
            return
        self.checked_at = self._clock()
        snapshot = self.snapshot
        if snapshot is not None and version != snapshot.version:
            self._mark_superseded()

    # --- the request path --------------------------------------------------------------------

    def get(self):
        """Return the current snapshot, reloading it if the config version or the rows
        changed, or switching to the next one at a dated row's moment."""
        snapshot = self.snapshot
        if snapshot is not None and not self.stale:
            now = self._clock()
            if now - self.checked_at < self.check_interval_s and now < self.due_at:
                return snapshot
            snapshot = self._due(snapshot, now)
            if not self.stale:
                return snapshot
        if snapshot is not None and self._clock() < self.retry_at:
            return snapshot  # the last load failed moments ago; replies keep marking it stale
        if self._leaves_to_watcher(snapshot):
            return snapshot
        return self._reload()

    def current(self):
        """Return the snapshot ``get()`` would return without reading the store or the
        database, or None when it has to (the async path then runs ``get`` in a thread)."""
        snapshot = self.snapshot
        if snapshot is None:
            return None
        now = self._clock()
        if not self.stale:
            if now < self.due_at and now - self.checked_at < self.check_interval_s:
                return snapshot
            if now >= self.switch_at:
                snapshot = self._switch_if_due(snapshot, now)
                if not self.stale and now < self.due_at and \
                        now - self.checked_at < self.check_interval_s:
                    return snapshot
            if not self.stale:
                return None  # a poll or a comparison is due
        if now < self.retry_at or self._leaves_to_watcher(snapshot):
            return snapshot
        return None

    def _due(self, snapshot, now):
        """What ``get`` does when the snapshot may be out of date: switch at a dated moment,
        compare the rows (without a watcher), poll the version. Returns the snapshot to serve
        unless it turned stale."""
        if now >= self.switch_at:
            snapshot = self._switch_if_due(snapshot, now)
        if not self.stale and self._watcher is None and now >= self.compare_at:
            self._compare_rows(snapshot, now)
        if not self.stale and now - self.checked_at >= self.check_interval_s:
            if self._watcher is not None:
                self._watcher.ensure_running()  # e.g. in a child forked after it started
            self._poll_version(snapshot)
        return snapshot

    def _leaves_to_watcher(self, snapshot):
        """Wake the watcher and return True when the stale ``snapshot`` may be served until
        the watcher has compiled the new one: the fence refuses its debits meanwhile."""
        if self._watcher is None or snapshot is None or self.reload_here:
            return False
        self._watcher.wake()
        return True

    def fresh(self, superseded, version=None):
        """Return rules newer than ``superseded``, a snapshot a fenced call found out of date:
        those the watcher installed meanwhile (a compile under way is waited for), or compiled
        now, as ``version`` (default: the version the store holds)."""
        with self._lock:
            current = self.snapshot
            if current is not None and (current.version != superseded.version
                                        or self._clock() < self.retry_at):
                return current  # newer; or the last compile failed moments ago
            self.stale = True
            if version is not None:
                self._ahead_until = self._clock() + PUBLICATION_WAIT_S
            return self._reload_locked(version=version)

    # --- the watcher -------------------------------------------------------------------------

    def _until_next_watch(self):
        """Seconds until the watcher's next round: its poll, a dated moment, or a comparison."""
        now = self._clock()
        # while the store cannot answer, poll as seldom as the request path would
        interval = self.check_interval_s if self._poll_failed else self.watch_interval_s
        wait = min(interval, self.switch_at - now,
                   self.compare_at - now if self.reload_interval_s else math.inf)
        return max(wait, 0.001)

    def _watch(self):
        """One round of the watcher: poll the version, reload, switch at a dated moment,
        compile the next moment's snapshot, compare the rows (each when due)."""
        snapshot = self.snapshot
        if snapshot is None:  # started before any request (start_watching): compile first
            snapshot = self.get()
            logger.info("ratelimit_app: process %d watches the quota configuration from "
                        "version %s", os.getpid(), snapshot.version)
            return
        try:
            version = self._poll_store()
        except StoreUnavailable:
            self._poll_failed = True  # keep the rules, poll less often until it answers
        else:
            self._poll_failed = False
            self.checked_at = self._clock()
            if version != snapshot.version and not self._ahead_of(version, snapshot):
                self._mark_superseded()
        # (compiles for the rules in force are never paced: once a version is published, each
        # request's debit is fenced until the new rules are in, so a pause would only make it
        # wait longer; with one table read again they are milliseconds of CPU)
        if self.stale and self._clock() >= self.retry_at:
            self._reload()
        now = self._clock()
        if now >= self.switch_at:
            self._switch_if_due(self.snapshot, now)
            if self.stale:
                self._reload()
        self._prepare_upcoming(self.snapshot)
        self._prepare_published(self.snapshot)
        if self.reload_interval_s and now >= self.compare_at and not self.stale:
            with self._compare_lock:
                self.compare_at = now + self.reload_interval_s
                self._compare_with(self.snapshot, pause_s=COMPARISON_PAUSE_S)

    def _prepare_upcoming(self, snapshot):
        """Compile the snapshot of ``snapshot.next_change_at`` once the moment is less than
        UPCOMING_LEAD_S away (kept in ``upcoming`` until the moment)."""
        if snapshot is None or snapshot.next_change_at == math.inf:
            return
        moment = snapshot.next_change_at
        upcoming = self.upcoming
        if upcoming is not None and upcoming.version == snapshot.version \
                and upcoming.compiled_at == moment:
            return
        if moment - self._wall_clock() > UPCOMING_LEAD_S:
            return
        try:
            # the dated parts only: the other rows are those of ``snapshot``
            upcoming = self._load(snapshot.version, RELOAD_PAUSE_S, at=moment,
                                  base=snapshot, changed=set())
        except Exception:  # a DB outage: the request at the moment compiles instead
            logger.exception("ratelimit_app: could not compile the rules of a dated row's "
                             "moment ahead of it")
            return
        upcoming.compiled_at = moment
        self.upcoming = upcoming

    def _prepare_published(self, snapshot):
        """Compile the rules of a version recorded ahead of its publication (its lead, see
        versions.py) from ``snapshot`` and the rows the record says it changed (everything,
        paced, when it cannot say: ``ratelimit reload``, a worker far behind); kept in
        ``prepared`` until a reload finds the version key at that version."""
        if self._newest_recorded is None or snapshot is None or self.stale:
            return
        try:
            newest = self._newest_recorded()
        except StoreUnavailable:
            return
        prepared = self.prepared
        if newest is None or newest == snapshot.version or (
                prepared is not None and prepared.base is snapshot
                and prepared.snapshot.version == newest):
            return
        try:
            changed = self._changed_since(snapshot, set(), newest)
        except StoreUnavailable:
            return
        # (a few rows: milliseconds, unpaced; everything: paced, as a dated moment's compile)
        pause_s = RELOAD_PAUSE_S if changed is None else 0.0
        with self._lock:  # a fenced request meanwhile waits for it, and then installs it
            if self.snapshot is not snapshot or self.stale:
                return
            try:
                compiled, fingerprint = self._compile(newest, snapshot, changed, pause_s)
            except Exception:  # a DB outage: the version is compiled when it is published
                logger.exception("ratelimit_app: could not compile the rules of a publication "
                                 "under way ahead of it")
                return
            self.prepared = _Prepared(snapshot, compiled, fingerprint, changed)

    def _take_prepared(self, version, pending):
        """Return the ``prepared`` rules if they are those of ``version`` on the current
        snapshot, with nothing else noted as changed (``pending``) and no dated moment passed
        since they were compiled; None otherwise. Either way ``prepared`` is emptied."""
        prepared, self.prepared = self.prepared, None
        if prepared is None or prepared.snapshot.version != version or pending or \
                prepared.base is not self.snapshot or \
                prepared.snapshot.next_change_at <= self._wall_clock():
            return None
        return prepared

    # --- dated rows --------------------------------------------------------------------------

    def _switch_if_due(self, snapshot, now):
        """At ``switch_at``: install the upcoming snapshot if the wall clock has reached the
        moment (or mark the rules stale, to be compiled in the request, when it is not ready),
        else set the deadline again from the wall clock (it was only a recheck). Returns the
        snapshot to serve."""
        if self._wall_clock() < snapshot.next_change_at:
            self._schedule(snapshot, now)
            return snapshot
        upcoming = self.upcoming
        with self._swap_lock:
            if self.snapshot is not snapshot:
                return self.snapshot  # another thread switched (or reloaded) meanwhile
            if upcoming is not None and upcoming.version == snapshot.version \
                    and upcoming.compiled_at == snapshot.next_change_at:
                self.snapshot, self.upcoming = upcoming, None
                self._schedule(upcoming, now)
                return upcoming
        logger.info("ratelimit_app: a dated plan assignment or identity override starts or "
                    "ends now; reloading the rules")
        self._moment_missed = True
        self.stale = True
        return snapshot

    def _schedule(self, snapshot, now):
        """Set the monotonic deadline of ``snapshot.next_change_at`` (a wall-clock time), at
        most SCHEDULE_RECHECK_S ahead of ``now``."""
        if snapshot.next_change_at == math.inf:
            self.switch_at = math.inf  # no dated row ahead: nothing to recheck
        else:
            remaining = snapshot.next_change_at - self._wall_clock()
            self.switch_at = now + min(max(remaining, 0.0), SCHEDULE_RECHECK_S)
        self._set_due()

    def _set_due(self):
        # the request path compares the rows only where no watcher does
        self.due_at = self.switch_at if self._watcher is not None \
            else min(self.compare_at, self.switch_at)

    # --- the version and the rows ------------------------------------------------------------

    def _version_or(self, fallback):
        try:
            return self._read_version()
        except StoreUnavailable:
            return fallback

    def _poll_version(self, snapshot):
        self.checked_at = self._clock()
        version = self._version_or(None)  # None: keep serving the rules we have
        if version is not None and version != snapshot.version \
                and not self._ahead_of(version, snapshot):
            self._mark_superseded()

    def _ahead_of(self, version, snapshot):
        """True when ``snapshot`` was compiled as a publication under way, moments ago, that
        the version key (``version``) has not caught up with yet."""
        return self._clock() < self._ahead_until and \
            published_ms(version) < published_ms(snapshot.version)

    def _mark_superseded(self):
        """The store holds another version than the snapshot's: compile, and meanwhile decide
        nothing without Redis on the old rules."""
        if not self.stale and self._superseded is not None:
            self._superseded()
        self.stale = True

    def _compare_rows(self, snapshot, now):
        """At ``compare_at`` (no watcher): set the next one, and compare the rows with those
        ``snapshot`` was compiled from."""
        if not self._compare_lock.acquire(blocking=False):
            return  # another thread compares: serve ``snapshot`` meanwhile
        try:
            if now < self.compare_at or snapshot is not self.snapshot:
                return  # another thread compared (or reloaded) while this one got here
            self.compare_at = now + self.reload_interval_s
            self._set_due()
            self._compare_with(snapshot)
        finally:
            self._compare_lock.release()

    def _compare_with(self, snapshot, pause_s=0.0):
        """Compare the rows with those ``snapshot`` was compiled from (one query, see _digest);
        on a difference, mark it stale and announce a new version."""
        expected = self.fingerprint
        try:
            fingerprint = self._digest(pause_s)
        except Exception:  # a DB outage must not turn into 500s: keep the rules we have
            logger.exception("ratelimit_app: could not compare the quota rows with the "
                             "rules in memory")
            return
        if fingerprint == expected or snapshot is not self.snapshot:
            return  # unchanged, or reloaded meanwhile (from rows at least as new)
        parts = changed_rows(expected, fingerprint)
        if self._watcher is not None and self._published_meanwhile(snapshot):
            # the rows of an edit made through save(), whose own announcement follows its
            # commit: not an outside change (the watcher's next round compiles what the
            # publication recorded; an outside change among them is found at the next
            # comparison, against the new rows)
            self._mark_superseded()
            return
        self._note_changed(parts)
        if self._watcher is None:
            self._announce_change(snapshot, parts)
            self.stale = True  # the request reloads next
            return
        # the watcher holds the compile's lock from before the announcement: a request whose
        # debit the new version fences waits for this compile instead of compiling its own
        with self._lock:
            self._announce_change(snapshot, parts)
            self.stale = True
            self._reload_locked()

    def _published_meanwhile(self, snapshot):
        """Wait up to ANNOUNCE_GRACE_S for a version other than ``snapshot``'s (the watcher's
        reads, straight to the store): True as soon as one is seen."""
        deadline, pause = time.monotonic() + ANNOUNCE_GRACE_S, threading.Event()
        while True:
            try:
                if self._poll_store() != snapshot.version:
                    return True
            except StoreUnavailable:
                return False  # the announcement cannot be made either
            if time.monotonic() >= deadline:
                return False
            pause.wait(ANNOUNCE_GRACE_POLL_S)

    def _announce_change(self, snapshot, parts):
        """Announce that the rows of ``snapshot`` changed (those of ``parts``; None:
        unknown), unless another worker has (or the store cannot say); before the snapshot is
        marked stale, so that this worker's reload reads the new version, not the old one it
        would reload again at the next poll."""
        if self._version_or(None) == snapshot.version and \
                self._announce_new_version(snapshot.version, parts):
            logger.info("ratelimit_app: quota rows changed without an announced version (a "
                        "queryset update(), bulk_create, raw SQL, a migration); reloading and "
                        "announcing a new version to every worker")
            if self._noticed is not None:
                self._noticed()

    def _announce_new_version(self, superseded, parts):
        """Announce that the rows of version ``superseded`` changed; return True when this
        worker's announcement was the one that counted."""
        if self._announce is None:
            return False
        try:
            return self._announce(superseded, parts)
        except StoreUnavailable as exc:
            logger.error("ratelimit_app: quota rows changed, but Redis is unavailable to tell "
                         "the other workers (%s); each notices within CONFIG_RELOAD_INTERVAL_S",
                         exc)
            return False

    # --- compiling ---------------------------------------------------------------------------

    def _reload(self, pause_s=0.0):
        with self._lock:
            if self.snapshot is not None and not self.stale:
                return self.snapshot  # another thread reloaded while we waited
            return self._reload_locked(pause_s)

    def _reload_locked(self, pause_s=0.0, version=None):
        # an edit of this process during the reload may have committed after the rows were
        # read: it then still reloads in the next request
        edits_seen = self._edits_here
        pending, self._pending_parts = self._pending_parts, set()
        if version is None:
            # "unknown" differs from any real version: reload once the store answers
            version = self._version_or("unknown")
        base = self.snapshot if self.fingerprint is not None or not self.reload_interval_s \
            else None  # (no fingerprint: no snapshot yet, or one of a failed load)
        prepared = self._take_prepared(version, pending) if base is not None else None
        try:
            if prepared is None:
                changed = self._changed_since(base, pending, version)
                snapshot, fingerprint = self._compile(version, base, changed, pause_s)
            else:  # compiled ahead of the publication: a pointer swap
                snapshot, fingerprint, changed = prepared.snapshot, prepared.fingerprint, \
                    prepared.changed
        except Exception:  # a DB outage must not turn into 500s: keep the old rules
            logger.exception("ratelimit_app: could not load the quota configuration")
            self._note_changed(pending)
            if self.snapshot is None:
                self.snapshot = Snapshot(version="unknown")
            # try again at the next version poll, not on every request
            self.stale = False
            self._edits_reloaded = self._edits_here
            self._moment_missed = False
            self.checked_at = self._clock()
            self.retry_at = self.checked_at + self.check_interval_s
            return self.snapshot
        with self._swap_lock:
            self.snapshot, self.fingerprint = snapshot, fingerprint
            self.last_compile = "everything" if changed is None else sorted(changed)
            self.prepared_installs += prepared is not None
            if self.upcoming is not None and self.upcoming.version != version:
                self.upcoming = None
            self._edits_reloaded = edits_seen
            self._moment_missed = False
            self.stale = self.reload_here
            self.checked_at = self._clock()
            self.compare_at = (self.checked_at + self.reload_interval_s
                               if self.reload_interval_s else math.inf)
            self._schedule(snapshot, self.checked_at)
        if self._watcher is not None:
            self._watcher.ensure_running()
        return snapshot

    def _compile(self, version, base, changed, pause_s=0.0):
        """Return the snapshot of ``version`` (``base`` with the parts ``changed`` names read
        again; everything when None) and the digests of its rows."""
        # the digest before the rows: a change landing between the two then makes the next
        # comparison reload once more, rather than hide behind a newer digest
        fingerprint = self._digest(pause_s, changed) if self.reload_interval_s else None
        return self._load(version, pause_s, base=base, changed=changed), fingerprint

    def _changed_since(self, base, pending, version):
        """Return what changed since ``base`` was compiled (tables and rows, as ``changes.py``
        writes them), up to
        ``version`` (what the published versions say, and ``pending``), or None when that
        cannot be known: no ``base``, a store that cannot say, a version older than its record
        of changes or not in it."""
        if base is None or pending is None or self._changes_since is None \
                or base.version == "unknown":
            return None
        if version == base.version:
            return set(pending)
        try:
            logged = self._changes_since(base.version, version)
        except StoreUnavailable:
            return None
        return None if logged is None else logged | pending

