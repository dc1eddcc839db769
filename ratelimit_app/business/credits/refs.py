"""What a credit operation is given, checked: the account (``key:12``, ``user:5``,
``tenant:acme``), the units and id of a top-up, its note; and how staff know an account.

Every check raises ``CreditInputError`` with a message that says what to send instead; the
command, the admin and the staff API show it as it is.
"""

from django.contrib.auth import get_user_model

from ...config.models import ApiKey
from .models import MAX_TOP_UP_UNITS

__all__ = ["CreditInputError", "parse_ref", "parse_units", "units_of_text", "parse_top_up_id",
           "parse_note",
           "display_of", "MAX_TOP_UP_ID_LENGTH", "MAX_NOTE_LENGTH", "MAX_TENANT_LENGTH"]

MAX_TOP_UP_ID_LENGTH = 100
MAX_NOTE_LENGTH = 500
# "tenant:" and the name fit CreditAccount.ref (160 characters)
MAX_TENANT_LENGTH = 150


class CreditInputError(ValueError):
    """Bad input to a credit operation; the message says what to send."""


def parse_ref(ref):
    """Return the account ``ref`` names, written as the request path writes it (``key:12``,
    ``user:5``, ``tenant:acme``); CreditInputError if it names none."""
    if isinstance(ref, str):
        kind, colon, value = ref.partition(":")
        if colon and kind in ("key", "user") and value.isascii() and value.isdigit() \
                and int(value) > 0:
            return f"{kind}:{int(value)}"  # key:012 is key:12, as an identity writes it
        if colon and kind == "tenant" and value and len(value) <= MAX_TENANT_LENGTH \
                and value.isprintable():
            return ref
    shown = ref[:80] if isinstance(ref, str) else repr(ref)[:80]
    raise CreditInputError(f"“{shown}” names no account: write key:<API key id>, "
                           f"user:<user id> or tenant:<name> (up to {MAX_TENANT_LENGTH} "
                           f"printable characters).")


def parse_units(units):
    """Return ``units`` if it is an int from 1 to 10^12; CreditInputError otherwise. Text is
    refused, digits or not (``"7"``), as a quotas-as-code import refuses ``"rate": "3"``:
    one rule for every number a client sends. (The command reads its argument's digits
    itself, ``units_of_text``.)"""
    if isinstance(units, str):
        raise CreditInputError(f"units must be a whole number from 1 to 10^12, sent as a "
                               f"number, not as text (got {units[:40]!r}): write 7, not "
                               f"\"7\".")
    if isinstance(units, int) and not isinstance(units, bool) \
            and 1 <= units <= MAX_TOP_UP_UNITS:
        return units
    raise CreditInputError(f"units must be a whole number from 1 to 10^12 (got "
                           f"{str(units)[:40]!r}).")


def units_of_text(text):
    """Return the units a command-line argument ``text`` gives (ASCII digits) as an int;
    CreditInputError otherwise."""
    digits = text.strip()
    if digits.isascii() and digits.isdigit():
        return parse_units(int(digits))
    raise CreditInputError(f"units must be a whole number from 1 to 10^12 (got "
                           f"{text[:40]!r}).")


def parse_top_up_id(top_up_id):
    """Return ``top_up_id`` if it is 1 to 100 printable characters; CreditInputError
    otherwise."""
    if isinstance(top_up_id, str) and 1 <= len(top_up_id) <= MAX_TOP_UP_ID_LENGTH \
            and top_up_id.isprintable() and top_up_id.strip() == top_up_id:
        return top_up_id
    raise CreditInputError(
        f"The top-up id must be 1 to {MAX_TOP_UP_ID_LENGTH} printable characters, without "
        f"spaces at either end (your own reference for this top-up, such as an invoice "
        f"number: sent again, it credits nothing again).")


def parse_note(note):
    """Return ``note`` ("" for None) if it is text of at most 500 characters;
    CreditInputError otherwise."""
    note = "" if note is None else note
    if isinstance(note, str) and len(note) <= MAX_NOTE_LENGTH:
        return note
    raise CreditInputError(f"The note must be text of at most {MAX_NOTE_LENGTH} characters.")


def display_of(ref):
    """Return how staff know the account ``ref`` (an API key's prefix and name, a user name,
    a tenant's name; never a secret), or None if it names an API key or a user that does not
    exist."""
    kind, _, value = ref.partition(":")
    if kind == "tenant":
        return f"tenant {value}"
    if kind == "key":
        key = ApiKey.objects.filter(pk=int(value)).only("prefix", "name").first()
        return None if key is None else f"key {key.prefix}… ({key.name})"[:200]
    user = get_user_model().objects.filter(pk=int(value)).first()
    return None if user is None else user.get_username()[:200]
