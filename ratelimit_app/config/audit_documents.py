"""The configuration an audit entry records, and its diff, kept in proportion to what changed.

The document: the quotas-as-code export (``quotas_as_code.export_document``) plus the API keys'
plan, its dates, and tenant, which that format leaves out (``api_keys``, never imported).

An entry always stores its diff against the entry before it. The whole document (a checkpoint)
is stored only by the first entry, by the ``CHECKPOINT_EVERY``-th entry after a checkpoint, and
by an entry recorded from a whole export (below). The document of any entry is its nearest
checkpoint at or before it with the diffs after it applied (``document_at``): at most
``CHECKPOINT_EVERY`` small diffs. Stored whole at every save, the document made each entry as
large as the configuration (423 kB with the bench's 1,954 rows) and each save export it all
(about 200 ms of the saving process's CPU).

A process that records keeps the document of the last entry it knows (a ``DocumentState``,
held by ``audit.Recorder``), with the primary key of the row behind each item. A commit names the
rows it changed (``changes.py``); ``patched`` reads those rows alone, by primary key, and diffs
only the items they touched. A recorder catches up with the entries other processes recorded
from their diffs (``follow``), which name each item's key (``key``) and the row that holds it
(``row``).

What cannot be patched is exported whole, as every entry was before, and stored as a
checkpoint: a plan's change (other sections name plans by slug), a rule or an API key renamed
(overrides name them), a table changed whole (more than ``changes.MAX_ROWS_NAMED`` rows,
``loaddata``), a change noticed outside the app, a trail the recorder cannot follow (an entry
deleted), and a process's first entry. A user renamed changes the items that name the user
without any quota row changing: the next whole export records it.

Items are keyed by their natural key, as the diff and the import always have: two rows with one
natural key (which the admin's validation refuses) are one item.
"""

import dataclasses
import functools
import json

__all__ = ["API_KEYS", "CHECKPOINT_EVERY", "AuditTrailGap", "DocumentState", "sections",
           "empty_document", "audit_document", "diff_documents", "export_state", "patched",
           "apply_diff", "follow", "chain_intact", "document_at", "token"]

# The extra list an audit document holds beside the quotas-as-code sections (never imported:
# keys are issued in the admin, see quotas_as_code's docstring).
API_KEYS = "api_keys"
API_KEY_KEY = ("prefix", "user", "name")

CHECKPOINT_EVERY = 50

# the sections whose items other sections name (by slug, name or prefix): such a row renamed
# changes the items of rows no commit names
_NAMED_BY_OTHERS = ("plans", "rules", API_KEYS)


class AuditTrailGap(Exception):
    """An entry's document cannot be rebuilt: an entry between it and its checkpoint is gone."""


@dataclasses.dataclass(frozen=True)
class AuditSection:
    """One list of an audit document: the rows of ``model`` (``rows()``: a queryset that
    fetches the relations an item names), each row's ``item(row)``, the ``key`` fields that
    identify an item, and the order of the list (``sort_key(item)``)."""

    name: str
    model: type
    key: tuple
    noun: str
    rows: object
    item: object
    sort_key: object

    def key_of(self, item):
        return tuple(item.get(field) for field in self.key)


def _api_key_item(key):
    from .quotas_as_code import _json_value

    # the dates of the key's plan as the export writes a plan assignment's; an empty reason is
    # null, as entries recorded before keys had one read it, so they show no change
    return {"prefix": key.prefix, "user": key.user.get_username(), "name": key.name,
            "plan": key.plan.slug if key.plan_id else None, "tenant": key.tenant,
            "active": key.active, "starts_at": _json_value(key.starts_at),
            "ends_at": _json_value(key.ends_at), "reason": key.reason or None}


def _api_key_rows():
    from .models import ApiKey

    return ApiKey.objects.select_related("user", "plan").order_by("pk")


@functools.cache
def sections():
    """Return the AuditSections of a document, in the quotas-as-code order, API keys last (built
    once: a record asks for them several times, and they follow from the models alone)."""
    from . import quotas_as_code
    from .models import ApiKey

    found = [AuditSection(s.name, s.model, s.key, s.noun,
                          rows=lambda s=s: quotas_as_code._rows(s),
                          item=lambda row, s=s: quotas_as_code._item(s, row),
                          sort_key=lambda item, s=s: quotas_as_code._sort_key(s, item))
             for s in quotas_as_code.SECTIONS]
    found.append(AuditSection(API_KEYS, ApiKey, API_KEY_KEY, "API key", rows=_api_key_rows,
                              item=_api_key_item,
                              sort_key=lambda item: json.dumps(item, sort_keys=True)))
    return tuple(found)


def empty_document():
    """Return the document of an empty configuration."""
    from .quotas_as_code import FORMAT

    return {"format": FORMAT, **{section.name: [] for section in sections()}}


def audit_document():
    """Return the configuration in the database as an entry records it."""
    return export_state().as_document()


# --- the diff --------------------------------------------------------------------------------

def token(section_name, key):
    """The text naming an item in ``AuditEntry.touched``: its section and natural key."""
    return section_name + "|" + "|".join("" if value is None else str(value) for value in key)


def _label(noun, key_fields, item):
    if len(key_fields) == 1:
        return f"{noun} “{item[key_fields[0]]}”"
    parts = [f"{name} {item[name]}" for name in key_fields if item.get(name) not in (None, "")]
    return f"{noun} ({', '.join(parts)})"


def diff_documents(old, new, rows=None):
    """Return the changes from document ``old`` to ``new``: one dict per item added, changed or
    removed (``action``, ``section``, ``label``, ``token``, ``key``: the item's natural key;
    ``fields``: {name: [old, new]} for a change; ``item`` for an add or a removal), in section
    order. ``rows`` (``{section: {pk: key}}`` of ``new``, if known) adds ``row``, the primary key
    of the row holding an added or changed item, to those changes."""
    changes = []
    for section in sections():
        name, key_fields = section.name, section.key
        before = {section.key_of(item): item for item in old.get(name, [])}
        after = {section.key_of(item): item for item in new.get(name, [])}
        holders = {} if rows is None else {key: pk for pk, key in rows.get(name, {}).items()}
        for key, item in after.items():
            base = {"section": name, "label": _label(section.noun, key_fields, item),
                    "token": token(name, key), "key": list(key)}
            if rows is not None:
                base["row"] = holders.get(key)
            if key not in before:
                changes.append({"action": "add", **base, "item": item})
                continue
            fields = {field: [before[key].get(field), value] for field, value in item.items()
                      if before[key].get(field) != value}
            if fields:
                changes.append({"action": "change", **base, "fields": fields})
        changes += [{"action": "remove", "section": name,
                     "label": _label(section.noun, key_fields, item), "token": token(name, key),
                     "key": list(key), "item": item}
                    for key, item in before.items() if key not in after]
    return changes


# --- a document as a recorder keeps it ---------------------------------------------------------

@dataclasses.dataclass
class DocumentState:
    """A document as ``{section: {key: item}}``; when known, the row behind each item (``rows``:
    ``{section: {pk: key}}``; None for a document rebuilt from a checkpoint, whose items name no
    rows); ``entry``: ``(id, created)`` of the entry it is the document of (the creation time
    too: an id can come again after a rollback); ``checkpoint_id``: that entry's checkpoint."""

    items: dict
    rows: dict = None
    entry: tuple = None
    checkpoint_id: int = None

    @classmethod
    def from_document(cls, document):
        return cls({section.name: {section.key_of(item): item
                                   for item in document.get(section.name, [])}
                    for section in sections()})

    def as_document(self):
        from .quotas_as_code import FORMAT

        document = {"format": FORMAT}
        for section in sections():
            document[section.name] = sorted(self.items.get(section.name, {}).values(),
                                            key=section.sort_key)
        return document

    def part(self, keys):
        """The document of this state's items that ``keys`` (``{section: keys}``) names."""
        document = empty_document()
        for section in sections():
            items = self.items.get(section.name, {})
            document[section.name] = sorted(
                (items[key] for key in keys.get(section.name, ()) if key in items),
                key=section.sort_key)
        return document

    def copy(self):
        """Return a copy whose section dicts can change without changing this state's."""
        return DocumentState({name: dict(items) for name, items in self.items.items()},
                             None if self.rows is None else
                             {name: dict(rows) for name, rows in self.rows.items()},
                             self.entry, self.checkpoint_id)


def export_state():
    """Return the configuration in the database as a DocumentState that knows its rows."""
    items, rows = {}, {}
    for section in sections():
        items[section.name], rows[section.name] = {}, {}
        for row in section.rows():
            item = section.item(row)
            key = section.key_of(item)
            items[section.name][key] = item
            rows[section.name][row.pk] = key
    return DocumentState(items, rows)


def patched(state, changes):
    """Return ``(new state, diff)``: ``state`` (which knows its rows) with the rows ``changes``
    names read again (``{model name: frozenset of pks, or None: the whole table}``, as
    ``changes.by_table`` returns it), and the diff from ``state``; or None when the change
    cannot be patched (see the module's docstring)."""
    by_model = {section.model._meta.model_name: section for section in sections()}
    new = state.copy()
    touched = {}  # section name -> the keys of the items that may have changed
    for model_name, pks in changes.items():
        section = by_model.get(model_name)
        if section is None:
            continue  # a table no item comes from
        if pks is None or section.name == "plans":
            return None
        found = {row.pk: row for row in section.rows().filter(pk__in=pks)}
        items, rows = new.items[section.name], new.rows[section.name]
        for pk in pks:
            old_key, row = rows.pop(pk, None), found.get(pk)
            item = None if row is None else section.item(row)
            new_key = None if item is None else section.key_of(item)
            if old_key is not None and new_key is not None and old_key != new_key and \
                    section.name in _NAMED_BY_OTHERS:
                return None  # renamed: items of other rows name it
            if new_key is not None and new_key != old_key and new_key in items:
                return None  # a key another row held (two names swapped): export whole
            if old_key is not None:
                del items[old_key]
            if item is not None:
                items[new_key], rows[pk] = item, new_key
            touched.setdefault(section.name, set()).update(
                key for key in (old_key, new_key) if key is not None)
    return new, diff_documents(state.part(touched), new.part(touched), new.rows)


def apply_diff(state, diff):
    """Apply ``diff`` (an entry's) to ``state``, in place. Raises KeyError when a change does
    not name its key, or, to a state that knows its rows, the row of an added or changed item
    (entries recorded before diffs named them)."""
    for change in diff:
        name, key = change["section"], tuple(change["key"])
        items = state.items.setdefault(name, {})
        rows = None if state.rows is None else state.rows.setdefault(name, {})
        if change["action"] == "remove":
            items.pop(key, None)
            if rows is not None:
                for pk in [pk for pk, held in rows.items() if held == key]:
                    del rows[pk]
            continue
        if change["action"] == "add":
            items[key] = change["item"]
        else:
            items[key] = {**items[key], **{field: new
                                           for field, (_, new) in change["fields"].items()}}
        if rows is not None:
            if change.get("row") is None:
                raise KeyError("row")
            rows[change["row"]] = key


def follow(state, entries, to_id):
    """Apply to ``state`` (the document of entry ``state.entry``) the diffs of ``entries``
    (dicts with ``id``, ``previous_id``, ``diff`` and ``created``, in id order), which must
    follow it one by one up to entry ``to_id``; return it, its ``entry`` the last one's. Raises
    AuditTrailGap when they do not."""
    last = state.entry[0]
    for entry in entries:
        if entry["previous_id"] != last:
            raise AuditTrailGap(f"entry #{entry['id']} does not follow entry #{last} (an "
                                f"entry between them is gone)")
        try:
            apply_diff(state, entry["diff"])
        except (KeyError, TypeError, ValueError) as exc:
            raise AuditTrailGap(f"entry #{entry['id']}'s diff does not name its items' "
                                f"keys and rows") from exc
        last, state.entry = entry["id"], (entry["id"], entry["created"])
    if last != to_id:
        raise AuditTrailGap(f"entry #{to_id} does not follow entry #{last}")
    return state


def chain_intact(from_id, to_id):
    """Whether the entries after ``from_id`` up to ``to_id`` follow one another, none gone
    (what ``document_at`` needs to rebuild ``to_id`` from a checkpoint at ``from_id``)."""
    from .models import AuditEntry

    last = from_id
    for entry_id, previous_id in AuditEntry.objects.filter(id__gt=from_id, id__lte=to_id) \
            .order_by("id").values_list("id", "previous_id"):
        if previous_id != last:
            return False
        last = entry_id
    return last == to_id


def document_at(entry_id):
    """Return the DocumentState of entry ``entry_id`` (its rows unknown): its nearest checkpoint
    with the diffs after it applied. Raises AuditTrailGap when an entry between them is gone."""
    from .models import AuditEntry

    checkpoint = AuditEntry.objects.filter(id__lte=entry_id, snapshot__isnull=False) \
        .order_by("-id").values("id", "created", "snapshot").first()
    if checkpoint is None:
        raise AuditTrailGap(f"no entry up to #{entry_id} holds a whole configuration")
    state = DocumentState.from_document(checkpoint["snapshot"])
    state.entry, state.checkpoint_id = (checkpoint["id"], checkpoint["created"]), checkpoint["id"]
    following = AuditEntry.objects.filter(id__gt=checkpoint["id"], id__lte=entry_id) \
        .order_by("id").values("id", "created", "previous_id", "diff")
    return follow(state, following, entry_id)
