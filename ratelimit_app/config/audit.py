"""The audit trail: every committed change of the quota configuration, who made it, and how to
go back.

What is recorded, and when: any save or delete of a quota row (``runtime/signals.py`` calls
``note_change``) registers one callback on the commit of its transaction, so an admin save with
its inlines, an import of many rows or a restore is one entry, and a rolled-back change none.
Rows changed without a signal (a queryset's ``update()``, raw SQL) are recorded when a worker
notices them (``policy.PolicyCache``'s comparison of the rows calls ``record_outside_change``).

What an entry holds: the whole configuration after the change, in the quotas-as-code format
(``quotas_as_code.export_document``, plus the API keys' plan, its dates, and tenant, which
that format leaves out), and its field-by-field diff against the previous entry. Because every
entry holds a whole document, restoring one is an import of it (``restore_plan`` /
``restore``): a dry-run diff first, then one transaction and one version bump, recorded like
any import.

Who: ``acting_as`` names the actor for the changes made inside it (the admin: the signed-in
user; ``manage.py ratelimit import``: the command); any other save is "application code".
"""

import contextlib
import contextvars
import dataclasses
import functools
import json
import logging

from django.db import IntegrityError, transaction

from .commit_hooks import on_commit_once

__all__ = ["Actor", "acting_as", "note_change", "record", "record_outside_change",
           "audit_document", "diff_documents", "describe", "object_token", "restore_plan",
           "restore"]

logger = logging.getLogger("ratelimit_app")

# The extra list an audit snapshot holds beside the quotas-as-code sections (never imported:
# keys are issued in the admin, see quotas_as_code's docstring).
API_KEYS = "api_keys"
API_KEY_FIELDS = ("prefix", "user", "name", "plan", "tenant", "active", "starts_at", "ends_at",
                  "reason")
API_KEY_KEY = ("prefix", "user", "name")


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


def note_change(using=None):
    """Note that a quota row changed: record an entry when the surrounding transaction commits
    (at once outside a transaction), one per transaction however many rows it changed."""
    actor = _actor.get() or _default_actor()
    on_commit_once("audit", functools.partial(_record_after_commit, actor), using=using)


def _record_after_commit(actor):
    try:
        record(actor)
    except Exception:  # the change itself is committed; the trail must not turn it into a 500
        logger.exception("ratelimit_app: could not record a quota change in the audit trail")


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


def record(actor, *, baseline=False):
    """Record the current configuration as changed by ``actor``; return the AuditEntry, or None
    when nothing changed since the previous entry (unless ``baseline``: the first entry of an
    empty trail, recorded even without a change)."""
    from .models import AuditEntry

    for _ in range(5):
        previous = AuditEntry.objects.order_by("-id").first()
        if baseline and previous is not None:
            return None
        document = audit_document()
        old = previous.snapshot if previous else empty_document()
        diff = diff_documents(old, document)
        if not diff and not baseline:
            return None
        summary = summarize(diff)
        if actor.restored_from is not None:
            summary = f"restored entry #{actor.restored_from.pk}: {summary}"
        entry = AuditEntry(
            user=actor.user, actor=actor.name[:150], source=actor.source,
            summary=summary[:300], diff=diff, snapshot=document,
            touched="".join(f"\n{change['token']}" for change in diff) + "\n" if diff else "",
            previous=previous, opens_trail=previous is None, restored_from=actor.restored_from)
        try:
            with transaction.atomic():  # a savepoint: PostgreSQL goes on after the conflict
                entry.save()
            return entry
        except IntegrityError:
            # another process recorded after the same entry (or the first entry of an empty
            # trail): diff against its entry
            continue
    logger.error("ratelimit_app: the audit trail kept changing while recording; gave up")
    return None


# --- the document and its diff ---------------------------------------------------------------

def empty_document():
    """Return the document of an empty configuration."""
    from .quotas_as_code import FORMAT, SECTIONS

    return {"format": FORMAT, **{section.name: [] for section in SECTIONS}, API_KEYS: []}


def _api_key_item(key):
    from .quotas_as_code import _json_value

    # the dates of the key's plan as the export writes a plan assignment's; an empty reason is
    # null, as entries recorded before keys had one read it, so they show no change
    return {"prefix": key.prefix, "user": key.user.get_username(), "name": key.name,
            "plan": key.plan.slug if key.plan_id else None, "tenant": key.tenant,
            "active": key.active, "starts_at": _json_value(key.starts_at),
            "ends_at": _json_value(key.ends_at), "reason": key.reason or None}


def audit_document():
    """Return the configuration as an entry stores it: the quotas-as-code export, plus the API
    keys' plan, tenant and state (``api_keys``, never imported)."""
    from .models import ApiKey
    from .quotas_as_code import export_document

    document = export_document()
    keys = ApiKey.objects.select_related("user", "plan").order_by("pk")
    document[API_KEYS] = sorted((_api_key_item(key) for key in keys),
                                key=lambda item: json.dumps(item, sort_keys=True))
    return document


def _sections():
    """Return ``(name, key fields, noun)`` of every list an audit document holds."""
    from .quotas_as_code import SECTIONS

    return [(s.name, s.key, s.noun) for s in SECTIONS] + [(API_KEYS, API_KEY_KEY, "API key")]


def _token(section_name, key):
    return section_name + "|" + "|".join("" if value is None else str(value) for value in key)


def _label(noun, key_fields, item):
    if len(key_fields) == 1:
        return f"{noun} “{item[key_fields[0]]}”"
    parts = [f"{name} {item[name]}" for name in key_fields if item.get(name) not in (None, "")]
    return f"{noun} ({', '.join(parts)})"


def diff_documents(old, new):
    """Return the changes from document ``old`` to ``new``: one dict per item added, changed or
    removed (``action``, ``section``, ``label``, ``token``; ``fields``: {name: [old, new]} for
    a change; ``item`` for an add or a removal), in section order."""
    changes = []
    for name, key_fields, noun in _sections():
        def keyed(items):
            return {tuple(item.get(field) for field in key_fields): item for item in items}
        before, after = keyed(old.get(name, [])), keyed(new.get(name, []))
        for key, item in after.items():
            base = {"section": name, "label": _label(noun, key_fields, item),
                    "token": _token(name, key)}
            if key not in before:
                changes.append({"action": "add", **base, "item": item})
                continue
            fields = {field: [before[key].get(field), value] for field, value in item.items()
                      if before[key].get(field) != value}
            if fields:
                changes.append({"action": "change", **base, "fields": fields})
        changes += [{"action": "remove", "section": name,
                     "label": _label(noun, key_fields, item), "token": _token(name, key),
                     "item": item}
                    for key, item in before.items() if key not in after]
    return changes


def describe(diff):
    """Return the lines an operator reads for ``diff``, as the import's dry run writes them:
    '+ rule “x”: …', '~ rule “x”' then '    burst: 30 → 40', '- plan “old”'."""
    def text(value):
        return json.dumps(value, ensure_ascii=False)

    keys = {name: key_fields for name, key_fields, _ in _sections()}
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
    from .models import ApiKey
    from .quotas_as_code import SECTIONS, _item, _key_of

    if isinstance(obj, ApiKey):
        item = _api_key_item(obj)
        return _token(API_KEYS, tuple(item[field] for field in API_KEY_KEY))
    for section in SECTIONS:
        if isinstance(obj, section.model):
            return _token(section.name, _key_of(section, _item(section, obj)))
    return None


# --- restoring an entry ----------------------------------------------------------------------

def restore_plan(entry):
    """Return the ImportPlan that makes the configuration what it was at ``entry`` (its
    quotas-as-code part; API keys are left as they are). Raises QuotaFileError when it cannot
    be imported any more (a user or an API key it names is gone)."""
    from .quotas_as_code import plan_import

    document = {name: value for name, value in entry.snapshot.items() if name != API_KEYS}
    return plan_import(document)


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
