"""``manage.py ratelimit``: export/import (quotas as code), check, inspect, reset and top, against
the suite's real Redis."""

import io
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import CommandError, call_command
from django.test import Client

from ratelimit_app.admin.dashboard.text import counted, top_lines
from ratelimit_app.decision.keys import scope_token
from ratelimit_app.models import (ApiKey, EndpointCost, IdentityOverride, Plan, PlanAssignment,
                                  Rule)

from ..helpers import count_version_writes, limiter, load_demo_data, use_fake_clock

pytestmark = pytest.mark.django_db

SCRAPER = "198.51.100.7"
ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    """Run ``manage.py ratelimit *args`` in-process; return ``(stdout, stderr)``."""
    out, err = io.StringIO(), io.StringIO()
    call_command("ratelimit", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def failing(*args, returncode):
    """Run a command that must fail with ``returncode``; return its CommandError's message."""
    with pytest.raises(CommandError) as failure:
        run(*args)
    assert failure.value.returncode == returncode
    return str(failure.value)


def test_counted_gives_a_noun_the_number_of_its_count():
    assert [counted(n, "key") for n in (0, 1, 2)] == ["0 keys", "1 key", "2 keys"]
    assert counted(1, "entry", "entries") == "1 entry" and counted(2, "entry", "entries") == \
        "2 entries"
    summary = {"requests": 1, "denied": 1, "rate_429": 100.0, "shadow": 1, "degraded": 0}
    data = {"summary": summary, "window": "5m", "hot_keys": {"denials": [], "tokens": []},
            "rates": {"plan": [], "rule": [], "endpoint": []}}
    assert top_lines(data)[0] == ("Last 5m: 1 request, 1 denied (100.0 % 429), 1 shadow "
                                  "would-be denial, 0 decided without Redis.")


def export_document():
    return json.loads(run("export")[0])


def write(tmp_path, document, name="quotas.json"):
    path = tmp_path / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return str(path)


def item(document, section, **key):
    return next(i for i in document[section] if all(i[k] == v for k, v in key.items()))


@pytest.fixture
def demo():
    load_demo_data()
    # an override for each kind of reference: a user and a rule, an API key, an IP
    alice = PlanAssignment.objects.get(user__username="alice").user
    IdentityOverride.objects.create(user=alice, rule=Rule.objects.get(name="free-user"),
                                    rate=120, period_s=60, burst=60, reason="partner")
    # (a factor: half of every rule that applies to the key)
    IdentityOverride.objects.create(api_key=alice.ratelimit_api_keys.get(),
                                    factor=Decimal("0.5"))
    IdentityOverride.objects.create(ip="203.0.113.9", exempt=True, reason="monitoring")


@pytest.fixture
def version_writes(monkeypatch):
    """The config versions written (each one makes every worker reload)."""
    return count_version_writes(monkeypatch)


def test_export_is_byte_stable_sorted_by_natural_keys_and_holds_no_ids(demo, tmp_path):
    first = run("export")[0]
    # a row re-created gets a new id and comes last in the table: the file must not move
    rule = Rule.objects.get(name="free-ip")
    rule.pk = None
    Rule.objects.filter(name="free-ip").delete()
    rule.save()
    assert run("export")[0] == first
    path = tmp_path / "out.json"
    run("export", "--output", str(path))
    assert path.read_text(encoding="utf-8") == first

    document = json.loads(first)
    assert list(document) == ["format", "plans", "rules", "endpoint_costs", "plan_assignments",
                              "identity_overrides", "access_lists", "ban_rules"]
    assert [p["slug"] for p in document["plans"]] == ["enterprise", "free", "prepaid", "pro",
                                                   "studio"]
    assert [r["name"] for r in document["rules"]] == sorted(r.name for r in Rule.objects.all())
    assert list(item(document, "rules", name="free-user")) == [
        "name", "plan", "scope", "endpoint", "kind", "calendar_period", "rate", "period_s",
        "burst", "counts", "lease", "mode", "on_redis_failure", "enabled", "alert_thresholds",
        "debt", "counted_statuses", "counted_path_prefix"]
    assert item(document, "rules", name="free-user")["plan"] == "free"
    assert item(document, "plan_assignments", user="carol") == {
        "user": "carol", "plan": "enterprise", "tenant": "acme", "starts_at": None,
        "ends_at": None, "reason": ""}
    # the start is part of an override's key: a caller may have a permanent and a dated one
    undated = {"ends_at": None, "reason": ""}
    # (the demo's own dated override, dana's launch week, is exported with its dates)
    launch_week, = [o for o in document["identity_overrides"] if o["reason"] == "launch week"]
    assert launch_week["user"] == "dana" and launch_week["starts_at"] and launch_week["ends_at"]
    assert launch_week["factor"] == 2 and launch_week["rate"] is None
    assert [o for o in document["identity_overrides"] if o is not launch_week] == [
        {"user": None, "api_key": None, "ip": "203.0.113.9", "rule": None, "starts_at": None,
         "exempt": True, "factor": None, "rate": None, "period_s": None, "burst": None,
         **undated, "reason": "monitoring"},
        {"user": None, "api_key": "rk_alice", "ip": None, "rule": None, "starts_at": None,
         "exempt": False, "factor": 0.5, "rate": None, "period_s": None, "burst": None,
         **undated},
        {"user": "alice", "api_key": None, "ip": None, "rule": "free-user", "starts_at": None,
         "exempt": False, "factor": None, "rate": 120, "period_s": 60, "burst": 60,
         **undated, "reason": "partner"},
    ]
    # natural keys only: no ids, no API key secrets or digests, no timestamps
    for section in document.values():
        for entry in section if isinstance(section, list) else ():
            assert not {"id", "pk", "digest", "updated", "created"} & set(entry)
    assert "api_keys" not in document


def test_export_then_import_is_a_no_op(demo, tmp_path, version_writes,
                                       django_capture_on_commit_callbacks):
    path = tmp_path / "quotas.json"
    run("export", "--output", str(path))
    updated = dict(Rule.objects.values_list("name", "updated"))
    with django_capture_on_commit_callbacks(execute=True):
        out, _ = run("import", str(path))
    assert out == "Nothing to change.\n"
    assert version_writes == []  # nothing saved, nothing announced
    assert dict(Rule.objects.values_list("name", "updated")) == updated
    assert run("import", str(path), "--dry-run")[0] == "Nothing to change.\n"


def changed(document):
    """The demo's export with one change of every kind."""
    item(document, "rules", name="free-user")["burst"] = 40
    item(document, "rules", name="free-user")["mode"] = "shadow"
    document["rules"].append({"name": "team-user", "plan": "team", "scope": "user", "rate": 100,
                              "period_s": 60, "burst": 50})  # the rest: the model's defaults
    document["plans"].append({"slug": "team", "name": "Team"})
    item(document, "plan_assignments", user="bob")["plan"] = "team"
    document["endpoint_costs"].remove(item(document, "endpoint_costs", endpoint="api:search"))
    document["identity_overrides"].remove(item(document, "identity_overrides", ip="203.0.113.9"))
    return document


DRY_RUN = """\
+ plan “team”: name="Team", description="", default_for_authenticated=false, \
default_for_anonymous=false
~ rule “free-user”
    burst: 30 → 40
    mode: "enforce" → "shadow"
+ rule “team-user”: plan="team", scope="user", endpoint="", kind="token_bucket", \
calendar_period="", rate=100, period_s=60, burst=50, counts="requests", lease=0, mode="enforce", on_redis_failure="default", enabled=true, alert_thresholds="", debt=0, counted_statuses="", counted_path_prefix=""
- endpoint cost (endpoint api:search, method GET)
~ plan assignment “bob”
    plan: "pro" → "team"
- identity override (ip 203.0.113.9)
Dry run: would be 2 added, 2 changed, 2 removed; nothing changed.
"""


@pytest.mark.django_db(transaction=True)  # real commits: the bump runs when the import commits
def test_a_changed_file_dry_runs_then_applies_with_one_version_bump(demo, tmp_path,
                                                                    version_writes):
    before = run("export")[0]
    path = write(tmp_path, changed(json.loads(before)))
    assert run("import", path, "--dry-run")[0] == DRY_RUN
    assert run("export")[0] == before  # a dry run changes nothing
    version = limiter().read_version()

    out, _ = run("import", path)
    assert out.splitlines()[:-1] == DRY_RUN.splitlines()[:-1]
    assert len(version_writes) == 1  # six rows saved or deleted, one announcement
    new_version = limiter().read_version()
    assert new_version != version and new_version == version_writes[0]
    assert out.splitlines()[-1] == f"Imported: 2 added, 2 changed, 2 removed; config version " \
                                   f"{new_version}."
    assert Rule.objects.get(name="free-user").burst == 40
    assert Rule.objects.get(name="team-user").plan.slug == "team"
    assert PlanAssignment.objects.get(user__username="bob").plan.slug == "team"
    assert not EndpointCost.objects.filter(endpoint="api:search").exists()
    assert not IdentityOverride.objects.filter(ip="203.0.113.9").exists()
    assert limiter().snapshot().version == new_version  # this process reloaded at once

    # idempotent: the same file again changes nothing and announces nothing
    assert run("import", path)[0] == "Nothing to change.\n"
    assert len(version_writes) == 1


def test_keep_missing_keeps_rows_absent_from_the_file(demo, tmp_path):
    document = export_document()
    document["identity_overrides"] = []
    document["rules"] = [item(document, "rules", name="global")]
    path = write(tmp_path, document)
    out, _ = run("import", path, "--keep-missing", "--dry-run")
    assert out == "16 rows absent from the file kept (--keep-missing).\nNothing to change.\n"
    out, _ = run("import", path, "--dry-run")
    assert "- rule “free-user”" in out.splitlines() and "- identity override (user alice, " \
        "rule free-user)" in out.splitlines()


@pytest.mark.parametrize("count, rows, errors", [(1, "1 row", "1 error"),
                                                  (2, "2 rows", "2 errors")])
def test_counts_in_the_import_output_are_pluralised(demo, tmp_path, count, rows, errors):
    document = export_document()
    document["rules"] = document["rules"][count:]
    out, _ = run("import", write(tmp_path, document), "--keep-missing", "--dry-run")
    assert out.splitlines()[0] == f"{rows} absent from the file kept (--keep-missing)."
    for rule in document["rules"][:count]:
        rule["rate"] = 0
    path = write(tmp_path, document)
    assert failing("import", path, returncode=2) == f"{path}: {errors}; nothing changed."


def test_validation_errors_name_item_and_field_and_change_nothing(demo, tmp_path):
    before = run("export")[0]
    document = json.loads(before)
    item(document, "rules", name="pro-user")["rate"] = 0
    item(document, "rules", name="global")["burst"] = "many"
    item(document, "rules", name="free-ip")["scope"] = "planet"
    item(document, "rules", name="free-reports")["plan"] = "platinum"
    item(document, "plan_assignments", user="alice")["user"] = "mallory"
    item(document, "identity_overrides", api_key="rk_alice")["api_key"] = "rk_nokey"
    document["plans"][0]["colour"] = "gold"
    path = write(tmp_path, document)
    err = io.StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("ratelimit", "import", path, stdout=io.StringIO(), stderr=err)
    assert failure.value.returncode == 2
    assert str(failure.value) == f"{path}: 7 errors; nothing changed."
    assert err.getvalue().splitlines() == [
        "plans[0] (plan “enterprise”): unknown field(s) “colour” (known: slug, name, description, "
        "default_for_authenticated, default_for_anonymous).",
        "rules[3] (rule “free-ip”): scope: Value 'planet' is not a valid choice.",
        "rules[7] (rule “global”): burst: must be a whole number, not “many”.",
        "rules[9] (rule “pro-user”): rate: The rate must be at least 1 token per period.",
        "rules[5] (rule “free-reports”): plan: no plan “platinum” in the file.",
        "plan_assignments[0] (plan assignment “mallory”): user: no user with username "
        "“mallory” (users are not created by an import).",
        "identity_overrides[1] (identity override (api_key rk_nokey)): api_key: no API key with "
        "prefix “rk_nokey” (API keys are issued in the admin).",
    ]
    assert run("export")[0] == before


def test_duplicate_and_malformed_items_are_named(demo, tmp_path):
    document = export_document()
    document["rules"].append(dict(item(document, "rules", name="global"), burst=2000))
    document["endpoint_costs"].append("api:items costs 3")
    document["plan_assignments"][0]["plan"] = 7
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("ratelimit", "import", write(tmp_path, document), stdout=io.StringIO(),
                     stderr=err)
    assert err.getvalue().splitlines() == [
        "rules[13] (rule “global”): the same item as rules[7]; keep one.",
        "endpoint_costs[3]: an item must be a JSON object.",
        "plan_assignments[0] (plan assignment “alice”): plan: a reference is written as text "
        "(a slug) or null, not 7.",
    ]


@pytest.mark.parametrize("field, value, error", [
    ("rate", True, "rate: must be a whole number, not true."),
    ("burst", 150.9, "burst: must be a whole number, not 150.9 (write it without a decimal "
                     "point)."),
    ("burst", 150.0, "burst: must be a whole number, not 150.0 (write it without a decimal "
                     "point)."),
    ("rate", "10", "rate: must be a whole number, not “10”."),
    ("rate", float("nan"), "rate: must be a whole number, not NaN."),
    ("rate", 10 ** 30, f"rate: {10 ** 30} is out of range (at most 9,223,372,036,854,775,807)."),
    ("rate", int("9" * 4000), "rate: an integer of about 4001 digits is out of range (at most "
                              "9,223,372,036,854,775,807)."),
    ("burst", None, "burst: must not be null (a whole number)."),
    ("enabled", 1, "enabled: must be true or false, not 1."),
    ("enabled", "yes", "enabled: must be true or false, not “yes”."),
    ("endpoint", 5, "endpoint: must be text, not 5."),
    ("scope", ["ip"], "scope: must be text, not a list of 1 item."),
    ("alert_thresholds", {"80": 1}, "alert_thresholds: must be text, not an object of 1 field."),
    ("plan", ["pro"], "plan: a reference is written as text (a slug) or null, not a list of 1 "
                      "item."),
])
def test_values_of_the_wrong_type_are_refused_not_converted(demo, tmp_path, field, value, error):
    document = export_document()
    item(document, "rules", name="free-user")[field] = value
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps(document), encoding="utf-8")  # (NaN as JSON's NaN)
    err = io.StringIO()
    before = export_document()
    with pytest.raises(CommandError) as failure:
        call_command("ratelimit", "import", str(path), stdout=io.StringIO(), stderr=err)
    assert failure.value.returncode == 2 and str(failure.value).endswith("1 error; nothing changed.")
    assert err.getvalue().splitlines() == [f"rules[6] (rule “free-user”): {error}"]
    assert export_document() == before


def test_a_huge_value_is_described_not_echoed(demo, tmp_path):
    document = export_document()
    huge = "x" * 50_000_000
    item(document, "rules", name="free-user")["name"] = huge + "-a"
    item(document, "rules", name="global")["endpoint"] = huge
    document["plans"][0][huge] = 1
    path = write(tmp_path, document)
    err = io.StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("ratelimit", "import", path, stdout=io.StringIO(), stderr=err)
    lines = err.getvalue().splitlines()
    assert str(failure.value) == f"{path}: {len(lines)} errors; nothing changed."
    assert max(len(line) for line in lines) < 300
    shown = "“xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…” (50,000,002 characters)"
    assert f"rules[6] (rule {shown}): name: {shown} is too long: at most 64 characters." in lines
    assert "rules[7] (rule “global”): endpoint: “xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…” " \
        "(50,000,000 characters) is too long: at most 200 characters." in lines
    assert lines[0].startswith("plans[0] (plan “enterprise”): unknown field(s) “xxxxxxxxxxxxxxxx"
                               "xxxxxxxxxxxxxxxxxxxxxxxx…” (50,000,000 characters) (known:")


def test_a_file_of_many_errors_lists_the_first_fifty(demo, tmp_path):
    document = export_document()
    model = item(document, "rules", name="global")
    document["rules"] += [dict(model, name=f"r{n}", rate=True) for n in range(500)]
    path = write(tmp_path, document)
    err = io.StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("ratelimit", "import", path, stdout=io.StringIO(), stderr=err)
    assert str(failure.value) == f"{path}: 500 errors; nothing changed."
    lines = err.getvalue().splitlines()
    assert len(lines) == 51 and lines[-1] == "… and 450 more."


def test_deep_values_given_to_plan_import_are_refused_without_recursing(demo):
    from ratelimit_app.config.quotas_as_code import QuotaFileError, plan_import

    deep = []
    for _ in range(100_000):  # deeper than Python could recurse into
        deep = [deep]
    document = export_document()
    item(document, "rules", name="free-user")["rate"] = deep
    document["format"] = deep
    with pytest.raises(QuotaFileError) as failure:
        plan_import(document)
    assert failure.value.errors == ["“format” must be “ratelimit_app.quotas/1” (found a list "
                                    "of 1 item)."]
    document["format"] = "ratelimit_app.quotas/1"
    with pytest.raises(QuotaFileError) as failure:
        plan_import(document)
    assert failure.value.errors == ["rules[6] (rule “free-user”): rate: must be a whole "
                                    "number, not a list of 1 item."]


def test_export_to_an_unwritable_file_exits_2(tmp_path):
    message = failing("export", "--output", str(tmp_path / "missing" / "quotas.json"),
                      returncode=2)
    assert message.endswith("No such file or directory.")


@pytest.mark.django_db(transaction=True)  # real commits: the bump runs when the import commits
def test_rows_are_validated_together_and_a_late_error_rolls_everything_back(
        demo, tmp_path, version_writes):
    before = run("export")[0]
    document = json.loads(before)
    item(document, "rules", name="enterprise-user")["rate"] = 7000  # valid on its own
    # below the 20 tokens a report costs on the free plan: only the final state shows it
    item(document, "rules", name="free-user")["burst"] = 10
    # a second default plan for anonymous clients
    item(document, "plans", slug="pro")["default_for_anonymous"] = True
    path = write(tmp_path, document)
    err = io.StringIO()
    with pytest.raises(CommandError):
        call_command("ratelimit", "import", path, stdout=io.StringIO(), stderr=err)
    assert err.getvalue().splitlines() == [
        "plans[3] (plan “pro”): default_for_anonymous: “Free” is already the default plan for "
        "anonymous clients; untick it there first.",
        "rules[6] (rule “free-user”): burst: Burst 10 is below the cost of api:reports (POST) "
        "(20 tokens): such requests could never pass. Raise the burst to at least 20.",
    ]
    assert run("export")[0] == before and version_writes == []

    # moving the default from one plan to another in one file is fine: only the end state counts
    item(document, "rules", name="free-user")["burst"] = 30
    item(document, "plans", slug="free")["default_for_anonymous"] = False
    run("import", write(tmp_path, document))
    assert Plan.objects.get(default_for_anonymous=True).slug == "pro"
    assert len(version_writes) == 1


@pytest.mark.parametrize("content, message", [
    (None, "Cannot read {path}: No such file or directory."),
    ("{\"format\": ", "{path} is not valid JSON: Expecting value at line 1, column 12."),
    ("[]", "The file must hold a JSON object (what export writes)."),
    ("{\"format\": \"v0\"}", "“format” must be “ratelimit_app.quotas/1” (found “v0”)."),
    ("{\"format\": " + "[" * 100_000 + "]" * 100_000 + "}",
     "{path} nests lists or objects too deeply to be a quotas file"),
    ("{\"format\": " + "9" * 5000 + "}", "{path} cannot be read: a number in it has more "
                                         "than 4300 digits."),
    ("{\"format\": \"ratelimit_app.quotas/1\", \"plans\": []}",
     "“rules” must be a list (an empty list removes every row)."),
])
def test_unreadable_or_malformed_files_are_refused_with_exit_code_2(demo, tmp_path, content,
                                                                    message):
    path = tmp_path / "quotas.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    err = io.StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("ratelimit", "import", str(path), stdout=io.StringIO(), stderr=err)
    assert failure.value.returncode == 2
    assert message.format(path=path) in str(failure.value) + err.getvalue()


def test_import_refuses_to_apply_while_redis_is_down(demo, tmp_path, redis_server):
    before = export_document()
    path = write(tmp_path, changed(json.loads(json.dumps(before))))
    redis_server.kill()
    assert run("import", path, "--dry-run")[0] == DRY_RUN  # a dry run needs no Redis
    message = failing("import", path, returncode=1)
    assert message.startswith("Redis is unavailable; nothing imported")
    assert export_document() == before


# --- check ---------------------------------------------------------------------------------

def test_check_reports_every_line_ok(demo):
    limiter().bump_config_version()
    out, _ = run("check")
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "OK    system checks", "OK    store", "OK    script", "OK    decision",
        "OK    config version", "OK    clock skew", "OK    forwarded requests"]
    assert lines[3].startswith("OK    decision: a scratch decision was allowed and its key "
                               "deleted (")
    assert lines[4] == f"OK    config version: {limiter().read_version()}"
    assert "Redis is 0.0" in lines[5] and "this machine" in lines[5]


def test_check_warns_of_x_forwarded_for_from_an_untrusted_address(demo, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "TRUSTED_PROXIES": ["10.0.0.0/8"]}
    Client().get("/hello/", HTTP_X_FORWARDED_FOR="203.0.113.5")  # from 127.0.0.1
    limiter().flusher.flush_now()  # as the worker's flush thread does
    last = run("check")[0].splitlines()[-1]
    assert last.startswith("WARN  forwarded requests: a request from 127.0.0.1 carried "
                           "X-Forwarded-For at ")
    assert last.endswith("but 127.0.0.1 is not in TRUSTED_PROXIES: the header is ignored. If "
                         "it is your proxy, every client behind it shares its address; add it "
                         "to TRUSTED_PROXIES")
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "TRUSTED_PROXIES": ["127.0.0.1"]}
    last = run("check")[0].splitlines()[-1]
    assert last.startswith("OK    forwarded requests: 127.0.0.1, which sent X-Forwarded-For at ")
    assert last.endswith(", is in TRUSTED_PROXIES now")


def test_check_reads_the_clock_of_every_primary_of_a_cluster(redis_cluster, settings):
    redis_cluster.ensure_healthy()
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP,
                              "CLUSTER_NODES": [redis_cluster.nodes[0].address]}
    out, _ = run("check")
    assert "OK    store: the cluster store answers PING" in out.splitlines()
    skews = [line for line in out.splitlines() if line.startswith("OK    clock skew: ")]
    assert sorted(int(line.split()[5].split(":")[1]) for line in skews) == \
        sorted(master.port for master in redis_cluster.masters())


def test_check_fails_with_exit_code_1_when_redis_is_killed(redis_server):
    redis_server.kill()
    out = io.StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("ratelimit", "check", stdout=out)
    assert failure.value.returncode == 1 and str(failure.value) == "5 checks failed."
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("WARN  system check ratelimit_app.W004:")
    assert lines[1].startswith("FAIL  store: the redis store does not answer: ")
    assert lines[2:] == [f"FAIL  {name}: not checked: the store does not answer"
                         for name in ("script", "decision", "config version", "clock skew")]


def test_check_as_a_real_command_exits_1_without_a_traceback(redis_server):
    redis_server.kill()
    done = subprocess.run([sys.executable, "manage.py", "ratelimit", "check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "REDIS_URL": redis_server.url})
    assert done.returncode == 1
    assert "FAIL  store" in done.stdout and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("CommandError: 5 checks failed.")


# Django 6.1's RemovedInDjango2028Warning is a PendingDeprecationWarning: "-W
# error::DeprecationWarning" alone lets it through, so a real command is run with both as errors.
DEPRECATIONS_AS_ERRORS = ["-W", "error::DeprecationWarning",
                          "-W", "error::PendingDeprecationWarning"]


def test_export_as_a_real_command_raises_no_deprecation_warning(redis_server, tmp_path,
                                                               database_env):
    """``python -W error::DeprecationWarning manage.py ratelimit export`` on a scratch database:
    migrated, the demo loaded (sections with and without relations), then exported."""
    env = {**os.environ, "REDIS_URL": redis_server.url, **database_env(tmp_path)}

    def manage(*args):
        done = subprocess.run([sys.executable, *DEPRECATIONS_AS_ERRORS, "manage.py", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        assert "Warning" not in done.stderr
        return done.stdout

    manage("migrate", "--verbosity", "0")
    manage("load_demo")
    document = json.loads(manage("ratelimit", "export"))
    assert {"free", "pro", "enterprise"} <= {plan["slug"] for plan in document["plans"]}
    assert document["rules"] and document["endpoint_costs"] and document["plan_assignments"]


# --- inspect, reset, top -------------------------------------------------------------------

def scrape(count=60):
    """An anonymous scraper hammers the items (free-ip: burst 40); returns the 429s."""
    api = Client()
    return sum(api.get("/api/items/", REMOTE_ADDR=SCRAPER).status_code == 429
               for _ in range(count))


def test_inspect_shows_every_bucket_and_debits_nothing(demo):
    use_fake_clock()  # no refill between the two looks
    assert scrape() == 20
    out, _ = run("inspect", SCRAPER)
    assert out == run("inspect", SCRAPER)[0]  # the look took nothing
    lines = out.splitlines()
    assert lines[0] == f"IP {SCRAPER}: plan free, tenant —"
    assert lines[1].split() == ["rule", "scope", "endpoint", "mode", "tokens", "capacity",
                                "cost", "full", "in", "rate"]
    rows = {line.split()[0]: line for line in lines[2:-1]}
    assert set(rows) == {"global", "free-plan", "free-ip", "search-ip-trial", "auth-failures"}
    assert rows["free-ip"].split()[1:8] == ["ip", "every", "endpoint", "enforce", "0", "40",
                                            "—"]
    assert "(shared)" in rows["global"]
    assert lines[-1] == "Costs depend on the endpoint: add --endpoint NAME."


def test_inspect_an_endpoint_shows_what_a_request_costs(demo):
    out, _ = run("inspect", "bob", "--endpoint", "api:search")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert out.splitlines()[0] == "bob: plan pro, tenant —, GET api:search"
    assert set(rows) == {"global", "pro-user"}  # bob's IP buckets depend on where he calls from
    assert rows["pro-user"][1:9] == ["user", "every", "endpoint", "enforce", "200", "200", "5",
                                     "0"]
    out, _ = run("inspect", "alice", "--endpoint", "api:reports", "--method", "post")
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
    assert rows["free-user"][7] == "20" and rows["free-reports"][6] == "1"  # calls, not tokens


def test_inspect_of_an_exempt_client_or_an_unknown_one(demo):
    assert run("inspect", "203.0.113.9")[0].splitlines()[1] == \
        "Exempt from every limit (an identity override)."
    assert failing("inspect", "nobody", returncode=2) == (
        "No client matches “nobody” (a username, an API key prefix, an IP address, or user:ID, "
        "key:ID, ip:ADDRESS).")
    assert failing("inspect", "rk_", returncode=2).startswith(
        "“rk_” matches several API keys; name one: key:")


def test_inspect_with_redis_down_says_so(demo, redis_server):
    redis_server.kill()
    assert failing("inspect", "alice", returncode=1).startswith(
        "Redis is unavailable; the buckets cannot be read (")


def test_reset_asks_then_refills_the_own_buckets_and_is_audited_like_the_admin(
        demo, redis_client, monkeypatch):
    use_fake_clock()
    scrape()
    own_keys = f"rl:{{{scope_token('ip', SCRAPER)}}}*"
    assert redis_client.keys(own_keys)

    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    out, _ = run("reset", SCRAPER, "--user", "admin")
    assert out.endswith("[y/N] Nothing was reset.\n")
    assert redis_client.keys(own_keys) and not LogEntry.objects.exists()

    version = limiter().read_version()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    out, _ = run("reset", SCRAPER, "--user", "admin")
    assert redis_client.keys(own_keys) == []
    assert f"(1 key deleted; config version {limiter().read_version()})" in out
    assert limiter().read_version() != version  # workers drop their local denials
    entry = LogEntry.objects.get()
    assert entry.user.username == "admin" and entry.object_repr == f"buckets of IP {SCRAPER}"
    message = out.split("[y/N] ")[1].strip()
    assert entry.change_message == message + " Done with manage.py ratelimit reset."
    assert "free-ip" in run("inspect", SCRAPER)[0]
    assert Client().get("/api/items/", REMOTE_ADDR=SCRAPER).status_code == 200
    assert "(0 keys deleted; " in run("reset", "alice", "--user", "admin", "--yes")[0]


def test_reset_refuses_unknown_clients_operators_and_a_down_redis(demo, redis_server):
    assert failing("reset", "nobody", "--user", "admin", "--yes", returncode=2).startswith(
        "No client matches")
    assert failing("reset", SCRAPER, "--user", "alice", "--yes", returncode=2) == (
        "“alice” is not an active staff user with the ratelimit_app.reset_buckets permission; "
        "the reset is recorded under it.")
    redis_server.kill()
    assert failing("reset", SCRAPER, "--user", "admin", "--yes", returncode=1).startswith(
        "Redis is unavailable; nothing was reset (")
    assert not LogEntry.objects.exists()


def test_top_prints_the_hot_keys_and_429_rates(demo, redis_server):
    denied = scrape()
    for _ in range(3):
        Client().get("/api/search/", HTTP_X_API_KEY="rk_bob_pro")
    limiter().flusher.flush_now()
    out, _ = run("top", "--window", "5m")
    lines = out.splitlines()
    assert lines[0] == (f"Last 5m: 63 requests, {denied} denied (31.7 % 429), 0 shadow would-be "
                        f"denials, 0 decided without Redis.")
    denials = lines[lines.index("Hot keys by denials (5m)") + 2].split()
    assert denials == [SCRAPER, "free", "60", str(denied), "33.3", "40"]
    assert "bob · key rk_bob_p…" in out
    plan_rows = lines[lines.index("429 rate by plan (5m)") + 1:]
    assert plan_rows[1].split()[:3] == ["free", "60", str(denied)]

    with pytest.raises(CommandError, match="invalid choice: '2h'"):
        run("top", "--window", "2h")
    redis_server.kill()
    assert failing("top", returncode=1).startswith("Redis is unavailable: ")


def test_resetting_a_user_resets_the_keys_that_act_for_it(demo, redis_client, monkeypatch):
    # alice calls with her API key: the key is an identity of its own, with its own buckets
    IdentityOverride.objects.filter(api_key__isnull=False).delete()  # (the key is not exempt)
    use_fake_clock()
    api = Client()
    statuses = [api.get("/api/items/", HTTP_X_API_KEY="rk_alice_free",
                        REMOTE_ADDR=f"198.51.100.{i + 1}").status_code for i in range(61)]
    assert statuses == [200] * 60 + [429]   # her override's burst 60, in her key's bucket
    key = ApiKey.objects.get(user__username="alice")
    key_buckets = f"rl:{{{scope_token('key', key.id)}}}*"
    assert redis_client.keys(key_buckets)
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert "and IP buckets, and those of its 1 API key, are refilled" in \
        run("reset", "alice", "--user", "admin")[0]
    out, _ = run("reset", "alice", "--user", "admin", "--yes")
    assert redis_client.keys(key_buckets) == []
    assert out.startswith(f"Reset the buckets of alice and of its API keys {key.prefix}… "
                          f"(1 key deleted; ")
    assert out.strip().endswith("Not reset: the buckets of the addresses it calls from "
                                "(reset each by itself).")
    assert api.get("/api/items/", HTTP_X_API_KEY="rk_alice_free",
                   REMOTE_ADDR="198.51.100.1").status_code == 200
    # a key's reset says its user's own buckets are left alone
    out, _ = run("reset", f"key:{key.id}", "--user", "admin", "--yes")
    assert "Not reset: its user's own buckets" in out
