"""Quotas as code: the quota rows as one JSON document, and an import that applies one.

The document names every row and every reference by a natural key (plan slugs, rule names,
endpoint names, usernames, API key prefixes), never a database id, so it can live in version
control, be reviewed, and be applied to another environment whose ids differ. Items are sorted by
their natural key and fields come in the model's order: two exports of the same rows are
byte-identical, and a diff of two exports shows only real changes.

API keys are not in the document. A key is a credential, not a quota: its secret is never stored,
and its digest authenticates too (whoever can write a digest into a database has a working key
for that environment), so neither belongs in a file that is copied between environments and kept
in version control. Keys are issued, rotated and revoked in the admin; overrides refer to them by
prefix, and an import refuses an override whose key does not exist. Users are not created either:
assignments and overrides refer to users by username.

The allow and deny lists are a list of the document too (``access_lists``, entries naming
their user and API key as overrides do). A file written before the lists existed has no such
list: importing it leaves the lists as they are (``Section.optional``). The penalty box's ban
rules are an optional list the same way (``ban_rules``); the bans they imposed are not
configuration and stay out of the document.

An import is planned first (``plan_import``: what would be added, changed and removed, per item
and field, or the validation errors naming item and field), then applied (``apply_import``) in
one transaction with one config-version bump, so workers switch to the whole new set at once.

A dry run and an import run one validation, the admin's. Each item is read as the admin form
reads a row (text stripped; values checked and normalised by the model: a list entry's
``2001:DB8:1::/48`` is ``2001:db8:1::/48``, ``::ffff:0:0/96`` is ``0.0.0.0/0``) before any row
is written, so the plan compares and stores what the admin would store. The checks between
rows (a burst against the endpoint costs, one default plan) then run on the state the file
makes: in one transaction, every saved row's ``full_clean()``, all errors reported together;
the plan rolls that transaction back, the import commits it only when nothing was refused.
An entry that refuses, or exempts from quotas, a whole address family (``0.0.0.0/0``,
``::/0``) is refused unless the import is told it is meant (``allow_everyone``).
"""

import dataclasses
import decimal
import json

from django.core.exceptions import ValidationError
from django.db import transaction

from .document_values import (
    DocumentValueError,
    Shown,
    document_value,
    is_form_text,
    shown,
    shown_names,
)
from .models import (
    AccessListEntry,
    ApiKey,
    BanRule,
    EndpointCost,
    IdentityOverride,
    Plan,
    PlanAssignment,
    Rule,
)

__all__ = ["FORMAT", "QuotaFileError", "Change", "ImportPlan", "export_document", "dumps",
           "plan_import", "apply_import", "describe_change", "merged_text"]

FORMAT = "ratelimit_app.quotas/1"


# How many of a document's errors its QuotaFileError's message gives (``errors`` holds all).
ERRORS_SHOWN = 50


class QuotaFileError(Exception):
    """A document that cannot be imported; ``errors`` are sentences naming item and field, each
    of bounded length (values are ``shown``, never echoed whole)."""

    def __init__(self, errors):
        self.errors = list(errors)
        super().__init__("\n".join(self.shown_errors()))

    def shown_errors(self):
        """Return the first ERRORS_SHOWN errors, and a line saying how many more there are."""
        more = len(self.errors) - ERRORS_SHOWN
        return self.errors[:ERRORS_SHOWN] + ([f"… and {more:,} more."] if more > 0 else [])


@dataclasses.dataclass(frozen=True)
class Section:
    """One list of the document: the rows of ``model``, identified by the ``key`` fields."""

    name: str
    model: type
    key: tuple
    noun: str
    # a list added after the format's first files: a file without it (written before it
    # existed) leaves its rows as they are, rather than removing them all
    optional: bool = False
    # fields of files written before they were folded into another: (old name, field), the old
    # text read into the field (an override's "note" is in its "reason" since migration 0024)
    folded: tuple = ()

    @property
    def fields(self):
        """The model fields written to the document, key fields first (ids, auto-set and
        non-editable fields such as ``Rule.updated`` never are)."""
        editable = [f for f in self.model._meta.concrete_fields
                    if f.editable and not f.primary_key]
        by_name = {f.name: f for f in editable}
        return [by_name[name] for name in self.key] + \
            [f for f in editable if f.name not in self.key]


# In dependency order: a section refers only to sections before it (and to users and API keys,
# which the document does not manage).
SECTIONS = (
    Section("plans", Plan, ("slug",), "plan"),
    Section("rules", Rule, ("name",), "rule"),
    Section("endpoint_costs", EndpointCost, ("endpoint", "method", "plan"), "endpoint cost"),
    Section("plan_assignments", PlanAssignment, ("user",), "plan assignment"),
    # with its start: a caller may have a permanent override and a dated one for the same rule
    Section("identity_overrides", IdentityOverride, ("user", "api_key", "ip", "rule", "starts_at"),
            "identity override", folded=(("note", "reason"),)),
    Section("access_lists", AccessListEntry,
            ("kind", "target", "value", "user", "api_key", "starts_at"), "list entry",
            optional=True),
    # the penalty box's rules (the bans themselves are events, not configuration: never here)
    Section("ban_rules", BanRule, ("name",), "ban rule", optional=True),
)


# The field a reference to a row of these models is written as (a user: its USERNAME_FIELD).
_NATURAL_KEYS = {Plan: "slug", Rule: "name", ApiKey: "prefix"}


def _natural_key_field(model):
    """Return the field a reference to a ``model`` row is written as."""
    return _NATURAL_KEYS.get(model) or model.USERNAME_FIELD


def _json_value(value):
    """Return a model field's Python ``value`` as the document writes it."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, decimal.Decimal):  # an override's factor: a number, 2 or 0.5
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)  # e.g. a date: its canonical text


def _item(section, row):
    """Return ``row`` as a document item (references by natural key)."""
    item = {}
    for field in section.fields:
        if field.is_relation:
            target = getattr(row, field.name)
            item[field.name] = None if target is None else \
                getattr(target, _natural_key_field(field.related_model))
        else:
            item[field.name] = _json_value(field.value_from_object(row))
    return item


def _key_of(section, item):
    return tuple(item[name] for name in section.key)


def _sort_key(section, item):
    # None before any text; the whole item breaks ties between rows with the same natural key
    key = tuple((value is not None, "" if value is None else str(value))
                for value in _key_of(section, item))
    return key, json.dumps(item, sort_keys=True)


def _rows(section):
    """Return the section's rows in primary-key order, their relations fetched in one query."""
    rows = section.model.objects.order_by("pk")
    relations = [f.name for f in section.fields if f.is_relation]
    # select_related() with no names means "every relation" (deprecated in Django 6.1): a
    # section without relations joins nothing
    return rows.select_related(*relations) if relations else rows


def export_document():
    """Return every quota row as the document (a dict: ``format`` and one list per section)."""
    document = {"format": FORMAT}
    for section in SECTIONS:
        items = [_item(section, row) for row in _rows(section)]
        document[section.name] = sorted(items, key=lambda item: _sort_key(section, item))
    return document


def dumps(document):
    """Return ``document`` as the exported text: stable key order, indented, newline-ended."""
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


# --- planning an import ----------------------------------------------------------------------

@dataclasses.dataclass
class Change:
    """One row to add, change or remove. ``fields`` holds ``(name, old, new)`` for a change;
    ``item`` is the new document item (add, change); ``pk`` the row's id (change, remove: used
    to apply the change, never written anywhere)."""

    action: str
    section: Section
    label: str
    item: dict = None
    fields: list = dataclasses.field(default_factory=list)
    pk: int = None
    position: int = None


def _label(section, item):
    """Return how an operator recognises ``item``: 'rule “free-user”', 'endpoint cost
    (endpoint api:search, method GET)'."""
    if len(section.key) == 1:
        return f"{section.noun} {shown(item.get(section.key[0]))}"
    parts = [f"{name} {_shown_part(item[name])}" for name in section.key
             if item.get(name) not in (None, "")]
    return f"{section.noun} ({', '.join(parts)})"


def _shown_part(value):
    """A key field's value in a label: as it is when it is short text, else ``shown``."""
    text = shown(value)
    return value if not isinstance(value, Shown) and text == f"“{value}”" else text


def _where(section, position, item):
    return f"{section.name}[{position}] ({_label(section, item)})"


def _read_item(section, position, raw, errors):
    """Return ``(item, valid)``: the document item ``raw`` with every field converted as the
    model converts it (missing fields take the model's default; a value that cannot be converted
    is kept as it is and ``valid`` is False, its errors added); ``(None, False)`` if ``raw`` is
    not an object."""
    if not isinstance(raw, dict):
        errors.append(f"{section.name}[{position}]: an item must be a JSON object.")
        return None, False
    raw = _unfolded(section, raw)
    fields = {f.name: f for f in section.fields}
    item, problems = {}, []
    for name, field in fields.items():
        value = raw[name] if name in raw else \
            (None if field.is_relation else field.get_default())
        reference = f"a {_natural_key_field(field.related_model)}" if field.is_relation else ""
        try:
            value = document_value(field, value, reference=reference)
            if is_form_text(field) and value is not None:
                value = value.strip()  # as the admin's form fields read text
            item[name] = _json_value(value)
        except DocumentValueError as exc:
            problems.append(f"{name}: {exc.message}")
            # the item is refused; what names it in errors is short (a key field's value too)
            item[name] = None if field.is_relation else shown(value)
    unknown = set(raw) - set(fields)
    if unknown:
        problems.append(f"unknown field(s) {shown_names(unknown)} (known: {', '.join(fields)}).")
    # the item still counts as present: references to it are not reported missing as well
    errors.extend(f"{_where(section, position, item)}: {problem}" for problem in problems)
    return item, not problems


def _unfolded(section, raw):
    """Return the item ``raw`` with the text of its folded fields (``Section.folded``) read into
    the fields that hold it now; a folded field that is not text is left for the error that
    names an unknown field."""
    for old, into in section.folded:
        text, held = raw.get(old), raw.get(into, "")
        if isinstance(text, str) and isinstance(held, str):
            raw = {name: value for name, value in raw.items() if name != old}
            raw[into] = merged_text(held, text)
    return raw


def merged_text(kept, folded):
    """Return the text of a field that ``folded`` (an older field's text) was folded into:
    both, when they differ (migration 0024 merged each override's note into its reason so)."""
    kept, folded = kept.strip(), folded.strip()
    if kept and folded and folded != kept:
        return f"{kept} — {folded}"
    return kept or folded


def _check_fields(section, position, item, errors):
    """Add the model's own field errors (types, choices, limits, blank) of ``item``, or write
    its values back as the model normalises them (``normalize()``, which ``clean()`` calls
    too: what the admin stores)."""
    relations = [f.name for f in section.fields if f.is_relation]
    row = section.model(**{name: value for name, value in item.items() if name not in relations})
    try:
        row.clean_fields(exclude=relations)
        if hasattr(row, "normalize"):
            row.normalize()
    except ValidationError as exc:
        _add_errors(errors, _where(section, position, item), exc)
        return
    for field in section.fields:
        if not field.is_relation:
            item[field.name] = _json_value(field.value_from_object(row))


def _add_errors(errors, where, exc):
    for field, messages in sorted(exc.message_dict.items()):
        prefix = "" if field == "__all__" else f"{field}: "
        errors.extend(f"{where}: {prefix}{message}" for message in messages)


class _References:
    """Checks that each reference names a row that will exist after the import."""

    def __init__(self, document_items, keep_missing):
        self.known = {
            Plan: {item["slug"] for item in document_items["plans"]},
            Rule: {item["name"] for item in document_items["rules"]},
        }
        if keep_missing:
            self.known[Plan] |= set(Plan.objects.values_list("slug", flat=True))
            self.known[Rule] |= set(Rule.objects.values_list("name", flat=True))
        self._found = {}

    def problem(self, model, value):
        """Return why ``value`` does not name a ``model`` row, or None if it does."""
        if model in self.known:
            if value in self.known[model]:
                return None
            return f"no {model._meta.verbose_name} {shown(value)} in the file."
        field = _natural_key_field(model)
        count = self._found.get((model, value))
        if count is None:
            count = self._found[(model, value)] = model.objects.filter(**{field: value}).count()
        if count == 1:
            return None
        if count == 0:
            creator = "API keys are issued in the admin" if model is ApiKey else \
                "users are not created by an import"
            return f"no {model._meta.verbose_name} with {field} {shown(value)} ({creator})."
        return f"{count} API keys share the prefix {shown(value)}: rotate all but one of them."


def _read_document(document, keep_missing):
    """Return ``{section name: [(position, item)]}`` of a valid document; raise QuotaFileError
    listing every problem otherwise."""
    if not isinstance(document, dict):
        raise QuotaFileError(["The file must hold a JSON object (what export writes)."])
    if document.get("format") != FORMAT:
        raise QuotaFileError([f"“format” must be “{FORMAT}” (found "
                              f"{shown(document.get('format'))})."])
    errors = []
    names = [section.name for section in SECTIONS]
    unknown = set(document) - set(names) - {"format"}
    if unknown:
        errors.append(f"Unknown list(s) {shown_names(unknown)} (known: {', '.join(names)}).")
    for section in SECTIONS:
        if section.optional and section.name not in document:
            continue
        if not isinstance(document.get(section.name), list):
            errors.append(f"“{section.name}” must be a list (an empty list removes every row).")
    if errors:
        raise QuotaFileError(errors)

    read = {}
    for section in SECTIONS:
        read[section.name] = []
        seen = {}
        for position, raw in enumerate(document.get(section.name, ())):
            item, valid = _read_item(section, position, raw, errors)
            if item is None:
                continue
            key = _key_of(section, item)
            if key in seen:
                errors.append(f"{_where(section, position, item)}: the same item as "
                              f"{section.name}[{seen[key]}]; keep one.")
                continue
            seen[key] = position
            if valid:
                _check_fields(section, position, item, errors)
            read[section.name].append((position, item))
    references = _References({name: [item for _, item in items] for name, items in read.items()},
                             keep_missing)
    for section in SECTIONS:
        relations = [f for f in section.fields if f.is_relation]
        for position, item in read[section.name]:
            for field in relations:
                if item[field.name] is None:
                    continue
                problem = references.problem(field.related_model, item[field.name])
                if problem:
                    errors.append(f"{_where(section, position, item)}: {field.name}: {problem}")
    if errors:
        raise QuotaFileError(errors)
    return read


@dataclasses.dataclass
class ImportPlan:
    """What an import does: ``changes`` (empty: nothing to change), how many rows absent from
    the document are ``kept`` (``keep_missing``) instead of removed, and the ``warnings`` an
    operator reads before applying it (entries of a whole address family, allowed)."""

    changes: list
    kept: int = 0
    warnings: list = dataclasses.field(default_factory=list)


def plan_import(document, *, keep_missing=False, allow_everyone=False):
    """Return the ImportPlan that makes the database hold ``document``, validated as the
    import validates it (the rows checked together in a transaction rolled back here: a dry
    run refuses what the import refuses). Rows absent from the document are removed unless
    ``keep_missing``; an entry added or changed that refuses, or exempts from quotas, a whole
    address family is refused unless ``allow_everyone`` (then a warning). Raises
    QuotaFileError (naming item and field, every error) when the document cannot be
    imported."""
    plan = _changes_of(document, keep_missing)
    errors = []
    for change in plan.changes:
        warning = _everyone_warning(change)
        if warning is None:
            continue
        where = _where(change.section, change.position, change.item)
        if allow_everyone:
            plan.warnings.append(f"{where}: {warning}")
        else:
            errors.append(f"{where}: value: {warning} Import it with --allow-everyone if that "
                          f"is meant.")
    with transaction.atomic():
        errors += _apply(plan.changes)
        transaction.set_rollback(True)  # (a plan changes nothing)
    if errors:
        raise QuotaFileError(errors)
    return plan


def _everyone_warning(change):
    """Return the warning for a list entry ``change`` adds, or makes, an entry that denies,
    or exempts from quotas, a whole address family; None for any other change (an entry as
    wide before the change was confirmed when it was made: the admin asks nothing again
    either)."""
    if change.section.model is not AccessListEntry or change.action == "remove":
        return None

    def warning_of(item):
        return AccessListEntry(**{name: item[name] for name in
                                  ("kind", "target", "value", "exempt")}).everyone_warning()

    warning = warning_of(change.item)
    if warning and change.action == "change":
        before = {**change.item, **{name: old for name, old, _ in change.fields}}
        if warning_of(before) == warning:
            return None
    return warning


def _changes_of(document, keep_missing):
    """Return the ImportPlan of ``document`` read and compared with the rows, its items
    checked one by one (not yet together)."""
    read = _read_document(document, keep_missing)
    changes, kept = [], 0
    for section in SECTIONS:
        if section.optional and section.name not in document:
            kept += section.model.objects.count()  # (see Section.optional)
            continue
        existing = {}
        removals = []
        for row in _rows(section):
            item = _item(section, row)
            key = _key_of(section, item)
            if key in existing:  # a duplicate the admin let through: keep the oldest
                removals.append(Change("remove", section, _label(section, item), pk=row.pk))
            else:
                existing[key] = (row.pk, item)
        for position, item in sorted(read[section.name], key=lambda p: _sort_key(section, p[1])):
            key = _key_of(section, item)
            label = _label(section, item)
            if key not in existing:
                changes.append(Change("add", section, label, item=item, position=position))
                continue
            pk, old = existing.pop(key)
            fields = [(name, old[name], item[name]) for name in item if old[name] != item[name]]
            if fields:
                changes.append(Change("change", section, label, item=item, fields=fields, pk=pk,
                                      position=position))
        if keep_missing:
            kept += len(existing)
        else:
            removals += [Change("remove", section, _label(section, old), pk=pk)
                         for pk, old in existing.values()]
        changes += removals
    return ImportPlan(changes, kept)


def describe_change(change):
    """Return the lines an operator reads for ``change``: '+ rule “x”: rate=10, ...',
    '~ rule “x”' then one '    burst: 30 → 40' per field, '- plan “old”'."""
    if change.action == "remove":
        return [f"- {change.label}"]
    if change.action == "add":
        key = change.section.key
        values = ", ".join(f"{name}={json.dumps(value, ensure_ascii=False)}"
                           for name, value in change.item.items() if name not in key)
        return [f"+ {change.label}: {values}"]
    return [f"~ {change.label}"] + [
        f"    {name}: {json.dumps(old, ensure_ascii=False)} → {json.dumps(new, ensure_ascii=False)}"
        for name, old, new in change.fields]


# --- applying it -----------------------------------------------------------------------------

def _lookup(model, value):
    return model.objects.get(**{_natural_key_field(model): value})


def _save(change):
    section, item = change.section, change.item
    row = section.model.objects.get(pk=change.pk) if change.pk else section.model()
    for field in section.fields:
        value = item[field.name]
        if field.is_relation:
            value = None if value is None else _lookup(field.related_model, value)
        setattr(row, field.name, value)
    row.save()
    return row


def apply_import(changes):
    """Apply ``changes`` (from ``plan_import``) in one transaction and announce them with one
    config-version bump at its commit. The rows are validated together again, as the plan
    validated them (the rows may have changed since); any error rolls everything back and
    raises QuotaFileError naming item and field."""
    with transaction.atomic():  # one version bump at its commit (runtime/signals.py)
        errors = _apply(changes)
        if errors:
            raise QuotaFileError(errors)  # rolls the transaction back


def _apply(changes):
    """Write ``changes`` in the transaction around this call, then validate every saved row
    against the state they make (``full_clean``: a rule's burst against the new costs, one
    default plan...: checks between rows, which need the other rows as the file leaves
    them); return the errors, naming item and field. The caller commits or rolls back."""
    order = {section.name: index for index, section in enumerate(SECTIONS)}
    saves = sorted((c for c in changes if c.action != "remove"),
                   key=lambda c: order[c.section.name])
    # removals last, the most dependent rows first, after the rows moving to a new plan moved
    removals = sorted((c for c in changes if c.action == "remove"),
                      key=lambda c: -order[c.section.name])
    saved = [(change, _save(change)) for change in saves]
    for change in removals:
        change.section.model.objects.filter(pk=change.pk).delete()
    errors = []
    for change, row in saved:
        try:
            row.full_clean()
        except ValidationError as exc:
            _add_errors(errors, _where(change.section, change.position, change.item), exc)
    return errors
