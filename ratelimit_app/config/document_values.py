"""The values of a quotas-as-code document, read strictly, and shown in errors in a few words.

A document is written by hand as often as by ``export``, so a value of the wrong type is a
mistake to name, not one to convert: ``"rate": true`` is not 1, ``"burst": 150.9`` is not 150,
``"enabled": 1`` is not true, ``"name": 5`` is not "5". What JSON gives is checked against the
model field's type before Django converts it, and never echoed whole: a 50 MB string, a
5,000-digit integer (which Python refuses to turn into text) or a deep list appears in an error
as a short description (``shown``). Every section of the document reads its fields through
``document_value``; a new section (or a new field type) needs no code of its own.
"""

import json

from django.core.exceptions import ValidationError
from django.db import models

__all__ = ["DocumentValueError", "Shown", "document_value", "is_form_text", "shown",
           "shown_names"]

# How much of a text an error shows.
SHOWN_CHARACTERS = 40
# Texts longer than this are refused before any other check (a field without max_length: a
# description); a field with max_length refuses more than its own.
MAX_TEXT_LENGTH = 10_000
# A date and time in ISO 8601 is never longer.
MAX_MOMENT_LENGTH = 64
# A reference to a row (a plan slug, a rule name, a username, an API key prefix).
MAX_REFERENCE_LENGTH = 200
# Integers beyond a 64-bit column are refused before Django compares them with its limits.
MAX_INTEGER = 2 ** 63 - 1
# How many names (unknown fields, unknown lists) an error lists.
SHOWN_NAMES = 5

_INTEGER_FIELDS = (models.IntegerField,)  # Positive…, Small…, Big… are IntegerFields
_NUMBER_FIELDS = (models.FloatField, models.DecimalField)
_TEXT_FIELDS = (models.CharField, models.TextField, models.GenericIPAddressField)


class DocumentValueError(ValueError):
    """A document value the field refuses; ``message`` is one short sentence."""

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class Shown(str):
    """A value as ``shown`` gives it, kept in place of a refused value: shown again as it is."""


def shown(value):
    """Return ``value`` as an error shows it (a Shown): JSON text for short values, a
    description for long or nested ones (never longer than about 80 characters)."""
    return value if isinstance(value, Shown) else Shown(_description(value))


def _description(value):
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        if value.bit_length() > 128:  # (about 39 digits)
            return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
        return str(value)
    if isinstance(value, float):
        return json.dumps(value)  # 150.9, Infinity, NaN
    if isinstance(value, str):
        if len(value) <= SHOWN_CHARACTERS:
            return _quoted(value)
        return f"{_quoted(value[:SHOWN_CHARACTERS])[:-1]}…” ({len(value):,} characters)"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value):,} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return f"an object of {len(value):,} field{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}"


def _quoted(text):
    # control characters (a NUL, a newline) written as escapes, so a line stays one line
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                      for c in text)
    return f"“{escaped}”"


def shown_names(names):
    """Return ``names`` (sorted) as an error lists them: at most SHOWN_NAMES, each ``shown``."""
    names = sorted(names, key=str)
    listed = ", ".join(shown(name) for name in names[:SHOWN_NAMES])
    rest = len(names) - SHOWN_NAMES
    return f"{listed} and {rest:,} more" if rest > 0 else listed


def document_value(field, value, *, reference="the row's name"):
    """Return ``value``, a document's value for the model ``field``, as the model holds it.

    Raises DocumentValueError naming what is wrong, in a bounded sentence. A relation's value
    is the referenced row's natural key (text, which ``reference`` names: "a slug") or null;
    it is returned as it is.
    """
    if value is None:
        if field.null or field.is_relation:
            return None
        raise DocumentValueError(f"must not be null{_expected(field)}.")
    if field.is_relation:
        _require_text(value, f"a reference is written as text ({reference}) or null",
                      MAX_REFERENCE_LENGTH)
        return value
    if isinstance(field, models.BooleanField):
        if not isinstance(value, bool):
            raise DocumentValueError(f"must be true or false, not {shown(value)}.")
        return value
    if isinstance(field, _INTEGER_FIELDS):
        return _integer(value)
    if isinstance(field, _NUMBER_FIELDS):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DocumentValueError(f"must be a number, not {shown(value)}.")
        if isinstance(field, models.DecimalField) and isinstance(value, float):
            # the number as written (0.1 is 0.1, not the binary float's 0.1000000000000000055…)
            value = repr(value)
        return _converted(field, value)
    if isinstance(field, models.DateTimeField):
        _require_text(value, "must be a date and time as text (ISO 8601) or null",
                      MAX_MOMENT_LENGTH)
        return _converted(field, value)
    if isinstance(field, _TEXT_FIELDS):
        _require_text(value, "must be text", field.max_length or MAX_TEXT_LENGTH)
        return _converted(field, value)
    _require_text(value, "must be text", MAX_TEXT_LENGTH)  # any other field: its text form
    return _converted(field, value)


def _expected(field):
    if isinstance(field, models.BooleanField):
        return " (true or false)"
    if isinstance(field, _INTEGER_FIELDS):
        return " (a whole number)"
    return " (write \"\" for none)" if isinstance(field, _TEXT_FIELDS) else ""


def _integer(value):
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value == value and abs(value) != float("inf"):
            raise DocumentValueError(f"must be a whole number, not {shown(value)} (write it "
                                     f"without a decimal point).")
        raise DocumentValueError(f"must be a whole number, not {shown(value)}.")
    if abs(value) > MAX_INTEGER:
        raise DocumentValueError(f"{shown(value)} is out of range (at most {MAX_INTEGER:,}).")
    return value


def is_form_text(field):
    """Return True if the admin's form for ``field`` reads it as free text, stripped of
    spaces at either end (Django's forms.CharField): the import reads it the same way."""
    return isinstance(field, (models.CharField, models.TextField)) and not field.choices \
        and not field.is_relation


def _require_text(value, what, max_length):
    if not isinstance(value, str):
        raise DocumentValueError(f"{what}, not {shown(value)}.")
    if len(value) > max_length:
        raise DocumentValueError(f"{shown(value)} is too long: at most {max_length:,} "
                                 f"characters.")
    # what no database stores as text: PostgreSQL refuses a NUL (SQLite would keep it), and
    # a lone surrogate (JSON's "\ud800" alone) is no character UTF-8 can write
    if "\x00" in value:
        raise DocumentValueError(f"{shown(value)} holds a NUL character (\\u0000), which "
                                 f"text cannot hold: remove it.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DocumentValueError(
            f"{shown(value)} holds a lone surrogate ({shown(value[exc.start])[1:-1]} at "
            f"character {exc.start + 1}), which is not a character: write the character "
            f"itself, or its two surrogates together.") from None


def _converted(field, value):
    """Django's own conversion of a value already of the right type (a date's text parsed)."""
    try:
        return field.to_python(value)
    except ValidationError as exc:
        # Django's messages may quote the value; it is short by now
        raise DocumentValueError(" ".join(exc.messages)) from None
