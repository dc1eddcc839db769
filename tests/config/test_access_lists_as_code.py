"""The allow and deny lists in quotas as code and in the audit trail: exported by natural keys,
imported back (a round trip changes nothing), refused with the entry and field named, kept when a
file written before the lists has no such list; every change an audit entry, and a restore."""

import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from ratelimit_app.config import audit
from ratelimit_app.config.quotas_as_code import QuotaFileError, apply_import, export_document, \
    plan_import
from ratelimit_app.models import AccessListEntry, ApiKey, AuditEntry, AuditSource

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: each is an audit entry


@pytest.fixture
def entries():
    mallory = User.objects.create(username="mallory")
    key, _ = ApiKey.create_key(mallory, "scraper", raw_key="rk_scrape_1234")
    AccessListEntry.objects.create(kind="deny", target="ip", value="2001:db8::/48",
                                   reason="v6 abuse")
    AccessListEntry.objects.create(kind="deny", target="api_key", api_key=key,
                                   reason="unpaid invoice")
    AccessListEntry.objects.create(kind="allow", target="ip", value="198.51.100.0/24",
                                   exempt=True, reason="monitoring")
    return mallory, key


def run(*args):
    out = io.StringIO()
    call_command("ratelimit", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_lists_are_exported_by_natural_keys_and_import_back_unchanged(entries, tmp_path):
    document = export_document()
    assert document["access_lists"] == [
        {"kind": "allow", "target": "ip", "value": "198.51.100.0/24", "user": None,
         "api_key": None, "starts_at": None, "exempt": True, "reason": "monitoring",
         "ends_at": None},
        {"kind": "deny", "target": "api_key", "value": "", "user": None,
         "api_key": "rk_scrap", "starts_at": None, "exempt": False, "reason": "unpaid invoice",
         "ends_at": None},
        {"kind": "deny", "target": "ip", "value": "2001:db8::/48", "user": None,
         "api_key": None, "starts_at": None, "exempt": False, "reason": "v6 abuse",
         "ends_at": None},
    ]
    assert plan_import(document).changes == []
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    AccessListEntry.objects.all().delete()
    run("import", str(path))
    assert export_document() == document


def test_an_import_adds_changes_and_removes_entries(entries):
    document = export_document()
    document["access_lists"][2]["reason"] = "v6 abuse, ticket 4711"
    del document["access_lists"][0]
    document["access_lists"].append({"kind": "deny", "target": "user_agent", "value": "sqlmap",
                                     "reason": "no scanners"})
    plan = plan_import(document)
    assert sorted(change.action for change in plan.changes) == ["add", "change", "remove"]
    apply_import(plan.changes)
    assert sorted(AccessListEntry.objects.values_list("reason", flat=True)) == [
        "no scanners", "unpaid invoice", "v6 abuse, ticket 4711"]


def test_an_import_refuses_what_the_admin_would_naming_entry_and_field(entries):
    document = export_document()
    document["access_lists"].append({"kind": "deny", "target": "api_key", "api_key": "rk_none",
                                     "reason": "gone"})
    document["access_lists"].append({"kind": "block", "target": "ip", "value": "1.2.3.4",
                                     "reason": "x"})
    with pytest.raises(QuotaFileError) as refused:
        plan_import(document)
    problems = "\n".join(refused.value.errors)
    assert "access_lists[3] (list entry (kind deny, target api_key, api_key rk_none)): api_key: " \
           "no API key with prefix “rk_none”" in problems
    assert "access_lists[4] (list entry (kind block, target ip, value 1.2.3.4)): kind: Value " \
           "'block' is not a valid choice." in problems
    assert AccessListEntry.objects.count() == 3


def test_a_bad_network_is_refused_with_its_entry_named(entries):
    document = export_document()
    document["access_lists"].append({"kind": "deny", "target": "ip", "value": "10.0.0.9/8",
                                     "reason": "typo"})
    with pytest.raises(QuotaFileError) as refused:
        apply_import(plan_import(document).changes)
    [error] = refused.value.errors
    assert error.startswith("access_lists[3] (list entry (kind deny, target ip, value "
                            "10.0.0.9/8)): value: ")
    assert "The network is 10.0.0.0/8" in error
    assert AccessListEntry.objects.count() == 3


def test_a_file_written_before_the_lists_leaves_them_as_they_are(entries):
    document = export_document()
    del document["access_lists"]
    plan = plan_import(document)
    assert plan.changes == [] and plan.kept == 3
    document["access_lists"] = "no"
    with pytest.raises(QuotaFileError, match="“access_lists” must be a list"):
        plan_import(document)


def test_every_change_is_audited_and_a_restore_brings_the_lists_back(entries):
    entry = AccessListEntry.objects.get(target="ip", kind="deny")
    entry.reason = "v6 abuse, ticket 4711"
    entry.save()
    latest = AuditEntry.objects.first()
    assert latest.summary == ("list entry (kind deny, target ip, value 2001:db8::/48): reason "
                              "\"v6 abuse\" → \"v6 abuse, ticket 4711\"")
    assert audit.object_token(entry) in latest.touched
    before_removal = latest
    AccessListEntry.objects.filter(kind="allow").delete()
    removed = AuditEntry.objects.first()
    assert removed.summary == "removed list entry (kind allow, target ip, value 198.51.100.0/24)"
    admin = User.objects.create(username="admin", is_staff=True)
    audit.restore(before_removal, admin)
    assert AccessListEntry.objects.filter(kind="allow", value="198.51.100.0/24",
                                          exempt=True).exists()
    restored = AuditEntry.objects.first()
    assert restored.source == AuditSource.RESTORE
    assert restored.summary.startswith(f"restored entry #{before_removal.pk}: added list entry")


def test_the_command_prints_the_plan_of_a_file(entries, tmp_path):
    document = export_document()
    document["access_lists"][0]["reason"] = "monitoring (ticket 12)"
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    out = run("import", str(path), "--dry-run")
    assert "~ list entry (kind allow, target ip, value 198.51.100.0/24)" in out
    assert '    reason: "monitoring" → "monitoring (ticket 12)"' in out
    with pytest.raises(CommandError):
        document["access_lists"][0]["kind"] = "maybe"
        path.write_text(json.dumps(document), encoding="utf-8")
        run("import", str(path))
