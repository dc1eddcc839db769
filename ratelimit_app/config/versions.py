"""The config version in the store: published at each change of the quota rows, and what every
debit is fenced on.

A version is a value never used before: the publication time in ms (readable when debugging,
and the order in which a Cluster's copies are told apart) plus 64 random bits. A counter is not
enough: after FLUSHALL, a restore or a failover to a replica that missed the last publication,
counting on from an older value can land on a number a worker already holds. Each publication
also records which tables or rows it changed (``changes_key``, the newest CHANGE_LOG_LENGTH;
``changes.py``), so that workers compile only those (policy.PolicyCache).

A publication of changed rows has a lead (CONFIG_PUBLISH_LEAD_S): its record is written first,
the version key that lead later. Each worker's watcher reads the newest record with the version
and compiles the rules of a version recorded but not yet published ahead of it (its rows are
committed: publications follow the commit), and installs them, a pointer swap, when the version
key reaches it. Every debit is fenced on the version key alone, so the lead changes nothing of
what is guaranteed from the publication on: it only lets a worker hold the new rules when the
publication comes, instead of compiling them in the first request the fence refuses.

On a Redis Cluster a script may read only keys of its own slot, so the version is copied into
every slot, each copy written before the version key (stores/cluster.py). A copy that differs
from the version key is either a publication under way (newer: its rows are committed, so the
worker compiles them as that version and waits for the version key) or a copy lost in a failover
or a node restart (older: rewritten from the version key, never the other way round).
"""

import logging
import secrets
import threading
import time

from ..decision import keys
from ..stores import StoreUnavailable
from ..stores.base import CHANGE_LOG_LENGTH

__all__ = ["ConfigVersions", "published_ms"]

logger = logging.getLogger("ratelimit_app")

# How long the claim of a change found by the comparison of the rows is kept: far longer than
# the workers' comparisons of one version's rows are apart.
NOTICE_CLAIM_TTL_MS = 600_000
# On a Cluster, how long a publication may take from its first copy to its version key: a
# worker that compiled its rows as that version, seen in a copy, waits this long for the version
# key rather than take the older one back.
PUBLICATION_WAIT_S = 1.0
# How often a worker waiting for a publication under way reads the version key.
AWAIT_POLL_S = 0.005


def published_ms(version):
    """Return the publication time (ms) a config version starts with: 0 for "0" (no version),
    -1 for one that says none. Versions are compared by it only to tell a Cluster's
    publication under way (its copies written, its version key not yet) from a lost copy,
    never to fence."""
    head = version.partition("-")[0]
    return int(head) if head.isascii() and head.isdigit() else -1


class ConfigVersions:
    """The config version of ``store`` under ``prefix``. ``guarded(operation, *args)`` runs a
    store call of the request path through the Limiter's breaker."""

    def __init__(self, store, prefix, guarded, lead_s=0.0, sleep=time.sleep):
        self.store = store
        self.key = keys.config_version_key(prefix)
        self.changes_key = keys.config_changes_key(prefix)
        self._guarded = guarded
        self.lead_s = lead_s
        self._sleep = sleep

    def read(self):
        """Return the version ("0" when unset). Raises StoreUnavailable."""
        return self._guarded(self.store.read_version, self.key)

    def poll(self):
        """``read`` for the watcher thread: not through the breaker, which counts the requests'
        calls. Raises StoreUnavailable."""
        return self.store.read_version(self.key)

    def publish(self, parts=None, lead=True):
        """Write a new version, recording what it changed (``parts``: model names and rows, see
        ``changes.py``; None: unknown); return it. Rows changed (``parts`` not empty) and
        ``lead``: the record is written ``lead_s`` before the version (see the module's
        docstring). Raises StoreUnavailable."""
        version = f"{int(time.time() * 1000)}-{secrets.token_hex(8)}"
        entry = f"{version} {'*' if parts is None else ','.join(sorted(parts))}"
        if not (lead and self.lead_s > 0 and (parts is None or parts)):
            self._guarded(self.store.write_version, self.key, version, (self.changes_key, entry))
            return version
        self._guarded(self.store.record_change, self.changes_key, entry)
        self._sleep(self.lead_s)  # the workers' watchers compile the rules meanwhile
        self._guarded(self.store.write_version, self.key, version)
        return version

    def newest_recorded(self):
        """Return the version of the newest record of changes, or None when there is none: a
        version ahead of the version key is a publication under way (its lead). For the
        watcher: not through the breaker. Raises StoreUnavailable."""
        entry = self.store.newest_change(self.changes_key)
        return None if entry is None else entry.partition(" ")[0]

    def changes_since(self, version, newest):
        """Return what the versions published after ``version`` up to ``newest`` changed (a set
        of model names and rows, see ``changes.py``), or None when the record cannot say: ``newest`` is
        not in it, ``version`` is older than it (or was never recorded), or a version changed
        tables it did not name. ``version`` "0" (no version key when it was compiled: a new or
        flushed Redis) is older than every entry of a record that was never trimmed. Raises
        StoreUnavailable."""
        changed, newest_seen = set(), False
        entries = self._guarded(self.store.read_changes, self.changes_key)
        for entry in entries:
            recorded, _, parts = entry.partition(" ")
            newest_seen = newest_seen or recorded == newest
            if recorded == version:
                return changed if newest_seen else None
            if parts == "*":
                return None
            changed.update(part for part in parts.split(",") if part)
        if version == "0" and newest_seen and len(entries) < CHANGE_LOG_LENGTH:
            # every version published since the key was unset is in the record (more entries
            # than that, older ones, only add parts to compile: never fewer)
            return changed
        return None

    def claim_change(self, superseded):
        """Claim the announcement of a change of the rows of version ``superseded`` that the
        comparison found: True for the first worker to ask. Raises StoreUnavailable."""
        return self._guarded(self.store.claim, f"{self.key}:noticed:{superseded}",
                             NOTICE_CLAIM_TTL_MS)

    def after_fence(self, held, found):
        """What a worker whose rules of version ``held`` were fenced by ``found`` does next:
        ``(True, None)`` to decide again on the same rules (a Cluster's copies were mended),
        or ``(False, label)`` to compile fresh rules, as ``label`` (None: the version key's)."""
        if not self.store.versions_copied:
            return False, None  # the fence read the version key itself
        try:
            current = self.read()
        except StoreUnavailable:
            current = found
        if current == held:
            if published_ms(found) > published_ms(current):
                # a publication under way: its copies are written before its version key, and
                # after its commit, so the rows read now are at least that version's
                return False, found
            self._repair_copies(found, current)
            return True, None
        if published_ms(held) > published_ms(current):
            # rules compiled as a publication under way (seen in another slot's copy) whose
            # copy in this slot is not written yet: wait for its version key
            if not self._await(held):
                # it never came (its process died, or a failover lost it): finish it, forwards
                self._finish_publication(current, held)
            return True, None
        return False, None

    def _await(self, version):
        """Poll the version key until it holds ``version`` (True), or PUBLICATION_WAIT_S
        passed (False)."""
        deadline, pause = time.monotonic() + PUBLICATION_WAIT_S, threading.Event()
        while time.monotonic() < deadline:
            try:
                if self.read() == version:
                    return True
            except StoreUnavailable:
                return False
            pause.wait(AWAIT_POLL_S)
        return False

    def _finish_publication(self, current, version):
        """Set the version key from ``current`` to ``version`` (unless it moved meanwhile), and
        the copies (never to an older version)."""
        logger.warning("ratelimit_app: the config version key held %s while copies held the "
                       "later %s; finishing that publication", current, version)
        try:
            self._guarded(self.store.finish_publication, self.key, current, version)
        except StoreUnavailable:
            pass  # the next attempt is fenced again, then the fail modes decide

    def _repair_copies(self, found, current):
        """Rewrite the copies behind the version key (lost in a failover or a node restarted
        without persistence) from it. The version key itself is never written here: a repair
        must not undo a publication."""
        logger.warning("ratelimit_app: a copy of the config version held %s instead of %s "
                       "(lost in a failover or a restart?); rewriting the copies", found, current)
        try:
            self._guarded(self.store.write_version_copies, self.key, current)
        except StoreUnavailable:
            pass  # the next attempt is fenced again, then the fail modes decide
