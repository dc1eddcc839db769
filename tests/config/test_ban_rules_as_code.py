"""The ban rules, and a rule's counted responses, in quotas as code: exported, imported back (a
round trip changes nothing), refused with the item and field named in a bounded message, nothing
half-applied, kept when a file written before the ban rules has no such list."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from ratelimit_app.config.quotas_as_code import QuotaFileError, apply_import, export_document, \
    plan_import
from ratelimit_app.models import BanRule, Rule

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rows():
    BanRule.objects.create(name="scrapers", scope="ip", events="statuses", statuses="404",
                           threshold=20, window_s=60, ban_s=600, factor=2, max_ban_s=86400)
    BanRule.objects.create(name="guessers", scope="ip", events="failed_auth", threshold=10,
                           window_s=60, ban_s=900, mode="shadow")
    Rule.objects.create(name="not-found", scope="ip", rate=20, period_s=60, burst=20,
                        counted_statuses="4xx", counted_path_prefix="/api")


def run(*args):
    out = io.StringIO()
    call_command("ratelimit", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_ban_rules_and_counted_responses_export_and_import_back_unchanged(rows, tmp_path):
    document = export_document()
    assert [item["name"] for item in document["ban_rules"]] == ["guessers", "scrapers"]
    assert document["ban_rules"][1] == {
        "name": "scrapers", "scope": "ip", "events": "statuses", "statuses": "404",
        "path_prefix": "", "threshold": 20, "window_s": 60, "ban_s": 600, "factor": 2,
        "max_ban_s": 86400, "memory_s": 86400, "extend_on_retry": False, "mode": "enforce",
        "enabled": True}
    [rule] = document["rules"]
    assert (rule["counted_statuses"], rule["counted_path_prefix"]) == ("4xx", "/api")
    assert plan_import(document).changes == []
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    BanRule.objects.all().delete()
    Rule.objects.all().delete()
    run("import", str(path))
    assert export_document() == document
    assert Rule.objects.get().counted_statuses == "4xx"


def test_an_import_adds_changes_and_removes_ban_rules(rows):
    document = export_document()
    document["ban_rules"][1]["threshold"] = 30
    del document["ban_rules"][0]
    document["ban_rules"].append({"name": "refused", "scope": "user", "events": "refusals",
                                  "threshold": 100, "window_s": 600, "ban_s": 3600})
    document["rules"][0]["counted_statuses"] = "401,403"
    plan = plan_import(document)
    assert sorted(change.action for change in plan.changes) == \
        ["add", "change", "change", "remove"]
    apply_import(plan.changes)
    assert dict(BanRule.objects.values_list("name", "threshold")) == \
        {"refused": 100, "scrapers": 30}
    assert Rule.objects.get().counted_statuses == "401,403"


@pytest.mark.parametrize("section, field, value, message", [
    ("ban_rules", "threshold", True, "threshold: "),
    ("ban_rules", "ban_s", 600.5, "ban_s: "),
    ("ban_rules", "threshold", 10 ** 5000, "threshold: "),
    ("ban_rules", "statuses", "x" * 50_000_000, "statuses: "),
    ("ban_rules", "extend_on_retry", "yes", "extend_on_retry: "),
    ("rules", "counted_statuses", 404, "counted_statuses: "),
], ids=["bool", "float", "huge-int", "huge-text", "bool-as-text", "int-as-text"])
def test_a_bad_value_is_refused_clearly_and_briefly(rows, section, field, value, message):
    document = export_document()
    document[section][0][field] = value
    with pytest.raises(QuotaFileError) as refused:
        plan_import(document)
    [error] = refused.value.errors
    assert error.startswith(f"{section}[0] (") and message in error
    assert len(error) < 400


@pytest.mark.parametrize("section, field, value, message", [
    ("ban_rules", "statuses", "4o4", "statuses: “4o4” is not a response status"),
    ("ban_rules", "max_ban_s", 60, "max_ban_s: The longest ban cannot be shorter"),
    ("rules", "counted_statuses", "600", "counted_statuses: “600” is not a response status"),
    ("rules", "counted_path_prefix", "login", "counted_path_prefix: A path prefix starts with"),
])
def test_what_the_admin_refuses_an_import_refuses_leaving_everything_as_it_was(
        rows, section, field, value, message):
    document = export_document()
    document["ban_rules"][1]["threshold"] = 99  # a valid change in the same file
    document[section][1 if section == "ban_rules" else 0][field] = value
    with pytest.raises(QuotaFileError) as refused:
        apply_import(plan_import(document).changes)
    assert any(message in error for error in refused.value.errors), refused.value.errors
    assert BanRule.objects.get(name="scrapers").threshold == 20
    assert Rule.objects.get().counted_statuses == "4xx"


def test_a_file_written_before_the_ban_rules_leaves_them_as_they_are(rows):
    document = export_document()
    del document["ban_rules"]
    plan = plan_import(document)
    assert plan.changes == [] and plan.kept == 2
    assert BanRule.objects.count() == 2
    document["ban_rules"] = {"name": "x"}
    with pytest.raises(QuotaFileError, match="“ban_rules” must be a list"):
        plan_import(document)


def test_the_command_prints_the_plan_and_refuses_a_bad_file(rows, tmp_path):
    document = export_document()
    document["ban_rules"][1]["ban_s"] = 1200
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    out = run("import", str(path), "--dry-run")
    assert "~ ban rule “scrapers”" in out and "    ban_s: 600 → 1200" in out
    document["ban_rules"][1]["scope"] = "planet"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(CommandError, match="1 error; nothing changed"):
        run("import", str(path))
    assert BanRule.objects.get(name="scrapers").ban_s == 600
