"""The audit trail: every committed change of the quota configuration, who made it, and how to
go back.

What is recorded, and when: any save or delete of a quota row (``runtime/signals.py`` calls
``note_change``) registers one callback on the commit of its transaction, so an admin save with
its inlines, an import of many rows or a restore is one entry, and a rolled-back change none.
Rows changed without a signal (a queryset's ``update()``, raw SQL) are recorded when a worker
notices them (``policy.PolicyCache``'s comparison of the rows calls ``record_outside_change``).

What an entry holds: its field-by-field diff against the previous entry and, every so often,
the whole configuration after it (``audit_documents.py``: the quotas-as-code format plus the API
keys' plan, its dates, and tenant). A save costs in proportion to the rows it changed: the
recorder (``Recorder``) keeps the configuration of the last entry and reads only the rows a
commit names. Any entry's configuration can be rebuilt, so restoring one is an import of it
(``restore_plan`` / ``restore``): a dry-run diff first, then one transaction and one version
bump, recorded like any import.

Who: ``acting_as`` names the actor for the changes made inside it (the admin: the signed-in
user; ``manage.py ratelimit import``: the command); any other save is "application code".
"""

import contextlib
import contextvars
import dataclasses
import json
import logging
import threading

from django.db import IntegrityError, transaction

from . import audit_documents
from .audit_documents import (
    API_KEYS,
    AuditTrailGap,
    audit_document,
    diff_documents,
    document_at,
    empty_document,
)
from .changes import add_row, by_table
from .commit_hooks import on_commit_once, waiting_for_commit

__all__ = ["Actor", "AuditTrailGap", "Recorder", "acting_as", "note_change", "record",
           "record_outside_change", "audit_document", "diff_documents", "describe",
           "document_of", "object_token", "restore_plan", "restore", "API_KEYS", "record_event"]

logger = logging.getLogger("ratelimit_app")


@dataclasses.dataclass(frozen=True)
class Actor:
    """Who changes the configuration: ``name`` as the trail shows it, the ``user`` (or None),
    the ``source`` (an ``AuditSource`` value) and, for a restore, the entry restored."""

    name: str
    source: str
    user: object = None
    restored_from: object = None


def _default_actor():
    from .models import AuditSource

    return Actor("application code", AuditSource.CODE)


_actor = contextvars.ContextVar("ratelimit_app_audit_actor", default=None)


@contextlib.contextmanager
def acting_as(actor):
    """Record the quota changes committed inside the block as made by ``actor``."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


class _EntryAtCommit:
    """The commit callback of one transaction: one entry, by the actor of its first change, for
    the rows it changed (``changes.py``'s strings; ``whole``: a change that named no row).
    Dropped with its transaction when that rolls back, like any commit callback."""

    def __init__(self, actor):
        self.actor = actor
        self.parts = set()
        self.whole = False

    def add(self, model_name, pk):
        if model_name is None:
            self.whole = True
        else:
            add_row(self.parts, model_name, pk)

    def __call__(self):
        try:
            record(self.actor, changes=None if self.whole else by_table(self.parts))
        except Exception:  # the change itself is committed; the trail must not make it a 500
            logger.exception("ratelimit_app: could not record a quota change in the audit trail")


def note_change(using=None, model_name=None, pk=None):
    """Note that a quota row (``model_name``, ``pk``; None: not named) changed: record an entry
    when the surrounding transaction commits (at once outside a transaction), one per
    transaction however many rows it changed."""
    waiting = waiting_for_commit("audit", using)
    if waiting is not None:
        waiting.add(model_name, pk)
        return
    waiting = _EntryAtCommit(_actor.get() or _default_actor())
    waiting.add(model_name, pk)  # before: outside a transaction it runs at once
    on_commit_once("audit", waiting, using=using)


def record_outside_change():
    """Record what changed without a signal since the last entry (called by the worker that
    noticed it); return the entry, or None. Never raises: it runs in that worker's comparison
    thread, or in a request where the comparison runs there (tests)."""
    from .models import AuditSource

    try:
        return record(Actor("outside the app", AuditSource.OUTSIDE))
    except Exception:
        logger.exception("ratelimit_app: could not record a quota change made outside the app")
        return None


class Recorder:
    """Records entries, keeping the configuration of the last entry this process knows (an
    ``audit_documents.DocumentState``): an entry for a commit that named its rows reads those
    rows alone. The cost is memory in the processes that record: about 0.8 kB per quota row
    (1.6 MB for the bench's 1,961 rows)."""

    def __init__(self):
        self._lock = threading.Lock()  # one recording at a time: they share the state
        self._state = None

    def record(self, actor, *, baseline=False, changes=None):
        from .models import AuditEntry

        with self._lock:
            for _ in range(5):
                previous = AuditEntry.objects.order_by("-id").values("id", "created").first()
                if baseline and previous is not None:
                    return None
                entry, state = self._entry(actor, previous, changes, baseline)
                if entry is None:
                    return None
                try:
                    with transaction.atomic():  # a savepoint: PostgreSQL goes on after it
                        entry.save()
                except IntegrityError:
                    # another process recorded after the same entry (or the first entry of an
                    # empty trail): diff against its entry
                    continue
                state.entry = (entry.pk, entry.created)
                if entry.snapshot is not None:
                    state.checkpoint_id = entry.pk
                self._state = state
                return entry
        logger.error("ratelimit_app: the audit trail kept changing while recording; gave up")
        return None

    def _entry(self, actor, previous, changes, baseline):
        """Return ``(entry, state)``: the unsaved AuditEntry after ``previous`` (its ``id`` and
        ``created``, or None) and the configuration it records; ``(None, None)`` when nothing
        changed (unless ``baseline``)."""
        from .models import AuditEntry

        base = self._state_at(previous)
        found = None
        if base is not None and base.rows is not None and changes is not None:
            found = audit_documents.patched(base, changes)
        if found is None:  # a whole export, stored whole: the next entries' checkpoint
            state = audit_documents.export_state()
            snapshot = state.as_document()
            diff = diff_documents(base.as_document() if base else empty_document(), snapshot,
                                  state.rows)
        else:
            state, diff = found
            # a checkpoint every CHECKPOINT_EVERY entries, and after an entry gone: the next
            # entries' documents are rebuilt from it
            due = base.checkpoint_id is None or \
                previous["id"] + 1 - base.checkpoint_id >= audit_documents.CHECKPOINT_EVERY or \
                not audit_documents.chain_intact(base.checkpoint_id, previous["id"])
            snapshot = state.as_document() if due and diff else None
        if not diff and not baseline:
            return None, None
        summary = summarize(diff)
        if actor.restored_from is not None:
            summary = f"restored entry #{actor.restored_from.pk}: {summary}"
        entry = AuditEntry(
            user=actor.user, actor=actor.name[:150], source=actor.source,
            summary=summary[:300], diff=diff, snapshot=snapshot,
            touched="".join(f"\n{change['token']}" for change in diff) + "\n" if diff else "",
            previous_id=None if previous is None else previous["id"],
            opens_trail=previous is None, restored_from=actor.restored_from)
        return entry, state

    def _state_at(self, previous):
        """The configuration of entry ``previous`` (None: an empty trail, no configuration):
        the one held, brought up to it with the diffs of the entries recorded since; or, when
        those cannot be followed, rebuilt from its checkpoint (its rows then unknown)."""
        from .models import AuditEntry

        if previous is None:
            return None
        held = self._state
        target = (previous["id"], previous["created"])
        if held is not None and held.entry is not None and held.entry[0] <= target[0]:
            if held.entry == target:
                return held
            entries = list(AuditEntry.objects.filter(id__gte=held.entry[0], id__lte=target[0])
                           .order_by("id").values("id", "created", "previous_id", "diff"))
            # the held entry still there (not rolled back, its id then given to another)
            if entries and (entries[0]["id"], entries[0]["created"]) == held.entry:
                state = held.copy()
                try:
                    audit_documents.follow(state, entries[1:], target[0])
                    if state.entry == target:
                        return state
                except AuditTrailGap:
                    pass
        try:
            return document_at(target[0])
        except AuditTrailGap:
            logger.warning("ratelimit_app: the audit trail's configuration before entry #%s "
                           "cannot be rebuilt; its diff is against an empty one", target[0] + 1)
            return None


_recorder = Recorder()


def record(actor, *, baseline=False, changes=None):
    """Record the current configuration as changed by ``actor``; return the AuditEntry, or None
    when nothing changed since the previous entry (unless ``baseline``: the first entry of an
    empty trail, recorded even without a change). ``changes``: the rows the change named
    (``changes.by_table``), read alone when they can be (None: compare everything)."""
    return _recorder.record(actor, baseline=baseline, changes=changes)


def record_event(actor, summary):
    """Record an event that changes no quota row (a ban imposed or lifted) in the trail, after
    its last entry, with an empty diff: the configuration each entry stands for stays what it
    was. Returns the AuditEntry, or None when the trail kept changing (logged)."""
    from .models import AuditEntry

    for _ in range(5):
        previous = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first()
        entry = AuditEntry(user=actor.user, actor=actor.name[:150], source=actor.source,
                           summary=summary[:300], diff=[], previous_id=previous,
                           opens_trail=previous is None)
        try:
            with transaction.atomic():
                entry.save()
        except IntegrityError:
            continue  # another process recorded after the same entry: follow it
        return entry
    logger.error("ratelimit_app: the audit trail kept changing while recording an event")
    return None


def document_of(entry):
    """Return the configuration as it was after ``entry`` (an AuditEntry), as a document.
    Raises AuditTrailGap when it cannot be rebuilt (an entry before it deleted)."""
    if entry.snapshot is not None:
        return entry.snapshot
    return document_at(entry.pk).as_document()


# --- reading a diff ----------------------------------------------------------------------

def describe(diff):
    """Return the lines an operator reads for ``diff``, as the import's dry run writes them:
    '+ rule “x”: …', '~ rule “x”' then '    burst: 30 → 40', '- plan “old”'."""
    def text(value):
        return json.dumps(value, ensure_ascii=False)

    keys = {section.name: section.key for section in audit_documents.sections()}
    lines = []
    for change in diff:
        if change["action"] == "add":
            values = ", ".join(f"{name}={text(value)}" for name, value in change["item"].items()
                               if name not in keys.get(change["section"], ()))
            lines.append(f"+ {change['label']}: {values}")
        elif change["action"] == "remove":
            lines.append(f"- {change['label']}")
        else:
            lines.append(f"~ {change['label']}")
            lines += [f"    {name}: {text(old)} → {text(new)}"
                      for name, (old, new) in change["fields"].items()]
    return lines


def summarize(diff):
    """Return one line saying what ``diff`` changed: 'rule “x”: burst 30 → 40', or counts."""
    if len(diff) == 1 and diff[0]["action"] == "change":
        change = diff[0]
        fields = "; ".join(f"{name} {json.dumps(old, ensure_ascii=False)} → "
                           f"{json.dumps(new, ensure_ascii=False)}"
                           for name, (old, new) in change["fields"].items())
        return f"{change['label']}: {fields}"
    if len(diff) == 1:
        return f"{'added' if diff[0]['action'] == 'add' else 'removed'} {diff[0]['label']}"
    counts = {action: sum(c["action"] == action for c in diff)
              for action in ("add", "change", "remove")}
    return f"{counts['add']} added, {counts['change']} changed, {counts['remove']} removed"


def object_token(obj):
    """Return the token entries that touched ``obj`` (a quota row or an API key) carry in
    ``AuditEntry.touched``, or None for another model."""
    for section in audit_documents.sections():
        if isinstance(obj, section.model):
            return audit_documents.token(section.name, section.key_of(section.item(obj)))
    return None


# --- restoring an entry ----------------------------------------------------------------------

def restore_plan(entry):
    """Return the ImportPlan that makes the configuration what it was at ``entry`` (its
    quotas-as-code part; API keys are left as they are). Raises QuotaFileError when it cannot
    be imported any more (a user or an API key it names is gone, or the trail before it)."""
    from .quotas_as_code import QuotaFileError, plan_import

    try:
        snapshot = document_of(entry)
    except AuditTrailGap as exc:
        raise QuotaFileError([f"The configuration of entry #{entry.pk} cannot be rebuilt: "
                              f"{exc}."]) from exc
    document = {name: value for name, value in snapshot.items() if name != API_KEYS}
    # an entry of a whole address family was confirmed when it was made, and staff confirm
    # the restore having read its plan and warnings
    return plan_import(document, allow_everyone=True)


def restore(entry, user):
    """Restore the configuration of ``entry`` through the import path (one transaction, one
    version bump), recorded as a restore by ``user``; return the ImportPlan applied."""
    from .models import AuditSource
    from .quotas_as_code import apply_import

    with transaction.atomic():
        plan = restore_plan(entry)  # planned and applied on the same rows
        actor = Actor(user.get_username(), AuditSource.RESTORE, user=user, restored_from=entry)
        with acting_as(actor):
            apply_import(plan.changes)
    return plan
