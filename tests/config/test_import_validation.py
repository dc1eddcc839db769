"""One validation and one normalisation for quotas as code: what the import refuses, its dry run
refuses with the same words and the same exit code; nothing is saved when anything is refused;
what is saved is what the admin would store (a list entry's network in its canonical form, text
stripped); an entry that denies, or exempts from quotas, a whole address family needs
``--allow-everyone``. Run on SQLite and, with RATELIMIT_TEST_DATABASE=postgresql, on PostgreSQL
(a NUL and a lone surrogate are refused by the import before either database sees them)."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from ratelimit_app.config.quotas_as_code import export_document
from ratelimit_app.models import AccessListEntry, AuditEntry, EndpointCost, Plan, Rule

from ..helpers import count_version_writes

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: versions, audit entries


@pytest.fixture
def rows():
    """A free plan whose reports cost 20 tokens, and a rule that holds them."""
    free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    EndpointCost.objects.create(endpoint="api:reports", method="POST", cost=20)
    Rule.objects.create(name="free-user", plan=free, scope="user", rate=10, period_s=60,
                        burst=30)


@pytest.fixture
def version_writes(monkeypatch):
    """The config versions written (each one makes every worker reload)."""
    return count_version_writes(monkeypatch)


def run(*args):
    """``manage.py ratelimit *args``: ``(exit code, stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ratelimit", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def write(tmp_path, document):
    path = tmp_path / "quotas.json"
    # json.dumps writes a lone surrogate as the escape "\ud800", as a hand-written file would
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


BAN_RULE = {"name": "scrapers", "scope": "ip", "events": "statuses", "statuses": "404",
            "threshold": 3, "window_s": 60, "ban_s": 600}
DENY = {"kind": "deny", "target": "ip", "value": "203.0.113.0/24", "reason": "abuse"}


def rule(**fields):
    return {"rules": {"name": "tiny", "plan": "free", "scope": "user", "rate": 1,
                      "period_s": 60, "burst": 4, **fields}}


def ban_rule(**fields):
    return {"ban_rules": {**BAN_RULE, **fields}}


def entry(**fields):
    return {"access_lists": {**DENY, **fields}}


# (an item the file adds, in its list; what the refusal says)
BAD_ITEMS = {
    "burst below an endpoint's cost": (
        rule(), "rules[1] (rule “tiny”): burst: Burst 4 is below the cost of api:reports "
                "(POST) (20 tokens): such requests could never pass. Raise the burst to at "
                "least 20."),
    "ban rule name": (
        ban_rule(name="a b<script>"), "ban_rules[0] (ban rule “a b<script>”): name: Use "
                                      "letters, digits"),
    "status abc": (ban_rule(statuses="404,abc"), "statuses: “abc” is not a response status"),
    "status 000": (ban_rule(statuses="000"), "statuses: “000” is not a response status"),
    "status in Unicode digits": (ban_rule(statuses="４０４"),
                                 "statuses: “４０４” is not a response status"),
    "status with a circled digit": (ban_rule(statuses="4①4"),
                                    "statuses: “4①4” is not a response status"),
    "path prefix": (ban_rule(path_prefix="api"),
                    "path_prefix: A path prefix starts with “/”, e.g. /login."),
    "longest ban below the first": (
        ban_rule(max_ban_s=60), "max_ban_s: The longest ban cannot be shorter than the first "
                                "one."),
    "network with host bits": (entry(value="10.0.0.9/8"), "The network is 10.0.0.0/8"),
    "short User-Agent": (entry(target="user_agent", value="ab"),
                         "value: Give at least 3 characters of the User-Agent"),
    "exempt deny entry": (entry(exempt=True), "exempt: Only an allow entry exempts its callers "
                                              "from quotas: untick it."),
    "end before start": (
        entry(starts_at="2027-01-02T00:00:00+00:00", ends_at="2027-01-01T00:00:00+00:00"),
        "ends_at: The end must be after the start"),
    "alert thresholds in Unicode digits": (
        rule(burst=40, period_s=3600, alert_thresholds="8①"),
        "alert_thresholds: “8①” is not a percent from 1 to 100"),
    "lone surrogate": (
        ban_rule(name="\ud800"), "ban_rules[0] (ban rule “\\ud800”): name: “\\ud800” holds a "
                                 "lone surrogate (\\ud800 at character 1), which is not a "
                                 "character"),
    "NUL in a reason": (
        entry(reason="abuse\x00"), "reason: “abuse\\x00” holds a NUL character (\\u0000), "
                                   "which text cannot hold: remove it."),
    "deny of every IPv4 caller": (
        entry(value="0.0.0.0/0"), "value: A deny entry for 0.0.0.0/0 refuses every IPv4 "
                                  "caller: the API answers them all 403. Import it with "
                                  "--allow-everyone if that is meant."),
    "deny of what normalises to every IPv4 caller": (
        entry(value="::ffff:0:0/96"), "value: A deny entry for 0.0.0.0/0 refuses every IPv4 "
                                      "caller"),
    "exempt allow of every IPv6 caller": (
        entry(kind="allow", exempt=True, value="::/0"),
        "value: An allow entry for ::/0 exempt from quotas spares every IPv6 caller every "
        "limit and ban."),
}


@pytest.mark.parametrize("added, message", BAD_ITEMS.values(), ids=BAD_ITEMS)
def test_the_dry_run_refuses_what_the_import_refuses_in_the_same_words_saving_nothing(
        rows, tmp_path, version_writes, added, message):
    document = export_document()
    [(section, item)] = added.items()
    document[section].append(item)
    path = write(tmp_path, document)
    audit_entries = AuditEntry.objects.count()

    dry_run = run("import", path, "--dry-run")
    applied = run("import", path)

    assert dry_run[0] == applied[0] == 2
    assert message in dry_run[2]
    assert dry_run[2] == applied[2]  # the same errors, the same words
    assert export_document() == {**document, section: document[section][:-1]}
    assert version_writes == [] and AuditEntry.objects.count() == audit_entries


def test_every_error_of_a_file_is_reported_at_once_and_nothing_is_saved(rows, tmp_path):
    document = export_document()
    document["rules"].append(rule()["rules"])
    document["ban_rules"].append(ban_rule(max_ban_s=60)["ban_rules"])
    document["access_lists"].append(entry(value="0.0.0.0/0")["access_lists"])
    before = export_document()
    code, _, errors = run("import", write(tmp_path, document))
    assert code == 2
    assert [line.split(":")[0] for line in errors.splitlines()] == [
        "access_lists[0] (list entry (kind deny, target ip, value 0.0.0.0/0))",
        "rules[1] (rule “tiny”)", "ban_rules[0] (ban rule “scrapers”)"]
    assert export_document() == before


def test_list_entries_are_stored_as_the_admin_form_stores_them(rows, tmp_path):
    document = export_document()
    document["access_lists"] += [
        {**DENY, "value": "2001:DB8:1::/48"},
        {**DENY, "target": "user_agent", "value": "  sqlmap  ", "reason": "  scanners "},
        {**DENY, "value": "::ffff:198.51.100.7"},
    ]
    document["rules"][0]["alert_thresholds"] = "100, 80"
    document["rules"][0]["period_s"] = 3600
    path = write(tmp_path, document)
    code, dry_run, _ = run("import", path, "--dry-run")
    assert code == 0
    # the plan shows what will be stored
    assert '+ list entry (kind deny, target ip, value 2001:db8:1::/48): exempt=false, ' \
           'reason="abuse", ends_at=null' in dry_run
    assert '+ list entry (kind deny, target user_agent, value sqlmap): exempt=false, ' \
           'reason="scanners", ends_at=null' in dry_run
    assert '    alert_thresholds: "" → "80,100"' in dry_run
    assert run("import", path)[0] == 0
    assert sorted(AccessListEntry.objects.values_list("value", "reason")) == [
        ("198.51.100.7", "abuse"), ("2001:db8:1::/48", "abuse"), ("sqlmap", "scanners")]
    assert Rule.objects.get(name="free-user").alert_thresholds == "80,100"
    # the file as written is now the database's: importing it again changes nothing
    assert run("import", path)[1] == "Nothing to change.\n"


def test_an_entry_of_a_whole_address_family_is_imported_with_the_flag_and_a_warning(
        rows, tmp_path):
    document = export_document()
    document["access_lists"].append({**DENY, "value": "::ffff:0:0/96"})
    path = write(tmp_path, document)
    code, out, _ = run("import", path, "--allow-everyone")
    assert code == 0
    assert "Warning (--allow-everyone): access_lists[0] (list entry (kind deny, target ip, " \
           "value 0.0.0.0/0)): A deny entry for 0.0.0.0/0 refuses every IPv4 caller" in out
    assert AccessListEntry.objects.get().value == "0.0.0.0/0"
    # unchanged by a later import, or changed but no wider, it is not refused again
    document["access_lists"][0]["value"] = "0.0.0.0/0"
    document["rules"][0]["burst"] = 40
    assert run("import", write(tmp_path, document))[0] == 0
    document["access_lists"][0]["reason"] = "outage drill"
    assert run("import", write(tmp_path, document))[0] == 0
    assert AccessListEntry.objects.get().reason == "outage drill"
    # an allow entry of everyone made exempt by a file is asked about
    document["access_lists"].append({**DENY, "kind": "allow", "value": "::/0"})
    assert run("import", write(tmp_path, document))[0] == 0
    document["access_lists"][1]["exempt"] = True
    code, _, errors = run("import", write(tmp_path, document))
    assert code == 2 and "An allow entry for ::/0 exempt from quotas" in errors


def test_a_limit_on_responses_may_have_a_burst_below_an_endpoints_cost(rows, tmp_path):
    document = export_document()
    failed_logins = {"name": "failed-logins", "plan": "free", "scope": "ip", "rate": 5,
                     "period_s": 60, "burst": 5, "counted_statuses": "401"}
    document["rules"].append(failed_logins)
    path = write(tmp_path, document)
    assert run("import", path, "--dry-run")[0] == 0
    assert run("import", path)[0] == 0
    assert Rule.objects.get(name="failed-logins").burst == 5
    # and a costlier endpoint added later is not refused because of it
    document["endpoint_costs"].append({"endpoint": "api:export", "method": "POST",
                                       "cost": 25})
    assert run("import", write(tmp_path, document))[0] == 0
