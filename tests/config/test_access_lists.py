"""The allow and deny lists' rows: what ``AccessListEntry.clean()`` refuses (in words an operator
can act on), how the compile reads them (the entries in force, their moments, only their table
after an edit of them), and the digest that notices an edit made without a signal."""

from datetime import datetime, timedelta, timezone

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ratelimit_app.config.compiler import compile_snapshot
from ratelimit_app.config.fingerprint import config_fingerprint
from ratelimit_app.decision.identity import Identity
from ratelimit_app.models import AccessListEntry, ApiKey

from .test_incremental_compile import compared, tables_read

pytestmark = pytest.mark.django_db

NOW = 1_700_000_000
AT = datetime.fromtimestamp(NOW, tz=timezone.utc)


def errors_of(**fields):
    """The field errors ``full_clean`` gives an entry of ``fields`` (a deny of an IP with a
    reason unless they say otherwise)."""
    entry = AccessListEntry(**{"kind": "deny", "target": "ip", "reason": "r", **fields})
    try:
        entry.full_clean()
    except ValidationError as exc:
        return exc.message_dict
    return {}


def test_clean_normalises_a_value_and_refuses_what_cannot_be_matched():
    entry = AccessListEntry(kind="deny", target="ip", value=" 2001:DB8::/48 ", reason="r")
    entry.full_clean()
    assert entry.value == "2001:db8::/48"
    assert "The network is 10.0.0.0/8" in errors_of(value="10.0.0.9/8")["value"][0]
    assert "write 2001:db8::/64" in errors_of(value="2001:db8::7")["value"][0]
    assert errors_of(value="")["value"] == ["Give the value to match."]
    assert errors_of(value="1.2.3.4", reason="")["reason"] == ["This field cannot be blank."]
    assert "at least 3" in errors_of(target="user_agent", value="Go")["value"][0]


def test_clean_asks_for_the_key_or_user_and_only_for_those():
    user = User.objects.create(username="mallory")
    key, _ = ApiKey.create_key(user, "k")
    assert errors_of(target="user") == {"user": ["Choose the user."]}
    assert errors_of(target="api_key") == {"api_key": ["Choose the API key."]}
    assert errors_of(target="user", user=user) == {}
    assert "clear it" in errors_of(target="ip", value="1.2.3.4", api_key=key)["api_key"][0]
    assert "leave the value empty" in errors_of(target="user", user=user, value="x")["value"][0]
    assert errors_of(value="1.2.3.4", exempt=True)["exempt"] == [
        "Only an allow entry exempts its callers from quotas: untick it."]
    assert errors_of(kind="allow", value="1.2.3.4", exempt=True) == {}


def test_clean_refuses_a_second_entry_for_the_same_callers():
    AccessListEntry.objects.create(kind="deny", target="ip", value="203.0.113.0/24", reason="r")
    assert errors_of(value="203.0.113.0/24")["__all__"] == [
        "The deny list already holds client IP 203.0.113.0/24: edit that entry."]
    assert errors_of(kind="allow", value="203.0.113.0/24") == {}  # the other list
    assert errors_of(value="203.0.113.0/24", starts_at=AT) == {}  # a dated one beside it


def test_the_end_comes_after_the_start():
    assert "after the start" in errors_of(value="1.2.3.4", starts_at=AT,
                                          ends_at=AT)["ends_at"][0]


def test_the_compile_holds_the_entries_in_force_and_their_next_moment():
    AccessListEntry.objects.create(kind="deny", target="ip", value="203.0.113.7", reason="now")
    AccessListEntry.objects.create(kind="deny", target="ip", value="203.0.113.8", reason="later",
                                   starts_at=AT + timedelta(seconds=30))
    AccessListEntry.objects.create(kind="deny", target="ip", value="203.0.113.9", reason="over",
                                   ends_at=AT - timedelta(seconds=1))
    snapshot = compile_snapshot("v1", NOW)
    assert snapshot.next_change_at == NOW + 30
    def reason(ip, lists_of=snapshot):
        found = lists_of.access_lists.match(Identity("anonymous", ip, ip, None), {},
                                            lambda: NOW)
        return found and found.reason

    assert reason("203.0.113.7") == "now"
    assert reason("203.0.113.8") is None and reason("203.0.113.9") is None
    later = compile_snapshot("v1", NOW + 30, base=snapshot, changed=set())
    assert reason("203.0.113.8", later) == "later"
    assert compared(later) == compared(compile_snapshot("v1", NOW + 30))


def test_no_entries_no_lists():
    assert compile_snapshot("v1", NOW).access_lists is None


def test_an_edit_of_an_entry_reads_the_lists_alone():
    entry = AccessListEntry.objects.create(kind="deny", target="tenant", value="globex",
                                           reason="r")
    base = compile_snapshot("v1", NOW)
    AccessListEntry.objects.filter(pk=entry.pk).update(value="initech")
    with CaptureQueriesContext(connection) as captured:
        partial = compile_snapshot("v2", NOW, base=base, changed={f"accesslistentry:{entry.pk}"})
    assert tables_read(captured) == {"ratelimit_app_accesslistentry"}
    assert list(partial.access_lists.tenants) == ["initech"]
    assert compared(partial) == compared(compile_snapshot("v2", NOW))
    assert partial.rules is base.rules


def test_the_digest_notices_an_entry_changed_without_a_signal():
    entry = AccessListEntry.objects.create(kind="deny", target="ip", value="203.0.113.7",
                                           reason="r")
    before = config_fingerprint()
    AccessListEntry.objects.filter(pk=entry.pk).update(reason="another")
    after = config_fingerprint()
    assert {part for part in after if after[part] != before[part]} == {"accesslistentry"}
