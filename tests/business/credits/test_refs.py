"""The checks of what a credit operation is given, and how staff know an account
(business/credits/refs.py)."""

import pytest

from ratelimit_app.business.credits.refs import (
    CreditInputError,
    display_of,
    parse_note,
    parse_ref,
    parse_top_up_id,
    parse_units,
    units_of_text,
)

from ...helpers import api_key


def test_an_account_is_written_as_the_request_path_writes_it():
    assert parse_ref("key:0012") == "key:12"
    assert parse_ref("user:5") == "user:5"
    assert parse_ref("tenant:Acme Corp") == "tenant:Acme Corp"
    for bad in ("key:", "key:-1", "key:１２", "ip:1.2.3.4", "tenant:", "tenant:a\nb", None, 12):
        with pytest.raises(CreditInputError, match="names no account"):
            parse_ref(bad)


def test_units_ids_and_notes():
    assert parse_units(7) == 7 and parse_units(10**12) == 10**12
    for bad in (0, -1, 10**12 + 1, 1.0, "1e3", "", None, False, "7", " 7 "):
        with pytest.raises(CreditInputError, match="whole number from 1 to 10\\^12"):
            parse_units(bad)
    # text is refused as text, as the import refuses "rate": "3"
    with pytest.raises(CreditInputError, match="sent as a number, not as text \\(got '7'\\)"):
        parse_units("7")
    # a command's argument is text: its ASCII digits are read
    assert units_of_text(" 7 ") == 7
    for bad in ("²", "７", "1e3", "", "0"):
        with pytest.raises(CreditInputError, match="whole number from 1 to 10\\^12"):
            units_of_text(bad)
    assert parse_top_up_id("inv-2026/0042 #1") == "inv-2026/0042 #1"
    assert parse_top_up_id("x" * 100) == "x" * 100
    for bad in ("", "x" * 101, "a\tb", " a", "a ", 42):
        with pytest.raises(CreditInputError, match="The top-up id must be"):
            parse_top_up_id(bad)
    assert parse_note(None) == "" and parse_note("n" * 500) == "n" * 500
    with pytest.raises(CreditInputError, match="at most 500 characters"):
        parse_note(["a list"])


@pytest.mark.django_db
def test_staff_know_an_account_by_its_key_user_or_tenant_never_a_secret():
    key, raw = api_key("ann")
    shown = display_of(f"key:{key.id}")
    assert shown == f"key {key.prefix}… (ann's key)" and raw not in shown
    assert display_of(f"user:{key.user_id}") == "ann"
    assert display_of("tenant:acme") == "tenant acme"
    assert display_of("key:999999") is None and display_of("user:999999") is None
