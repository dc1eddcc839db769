"""The audit trail (config/audit.py, admin/audit.py): one entry per admin save, import, restore or
noticed unannounced edit, with who, the field-by-field diff and the whole configuration after it;
and a restore through the import path.

Real commits (``transaction=True``): entries are recorded when a transaction commits.
"""

import io
import json

import pytest
from django.contrib.auth.models import AnonymousUser, Permission, User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ratelimit_app.config import audit
from ratelimit_app.config.quotas_as_code import export_document
from ratelimit_app.models import (
    AccessListEntry,
    AuditEntry,
    AuditSource,
    EndpointCost,
    IdentityOverride,
    Plan,
    PlanAssignment,
    Rule,
    Scope,
)
from ratelimit_app.runtime.limiter import Limiter

from ..helpers import limiter, use_fake_clock

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def config():
    """A small configuration saved by code (recorded as "application code")."""
    free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="free-user", plan=free, scope=Scope.USER, rate=60, period_s=60,
                        burst=30)
    Rule.objects.create(name="free-ip", plan=free, scope=Scope.IP, endpoint="hello", rate=1,
                        period_s=60, burst=1000)
    EndpointCost.objects.create(endpoint="api:search", method="GET", cost=5)
    carol = User.objects.create(username="carol")
    PlanAssignment.objects.create(user=carol, plan=free, tenant="acme")
    return free


@pytest.fixture
def version_writes(monkeypatch):
    """Count the SETs of the config version (each one makes every worker reload)."""
    store, writes = limiter().store, []
    write_version = store.write_version
    monkeypatch.setattr(store, "write_version",
                        lambda key, value, changes=None: (writes.append(value),
                                                          write_version(key, value, changes))[1])
    return writes


def latest():
    return AuditEntry.objects.order_by("-id").first()


def rule_post(rule, **fields):
    """The rule change form's POST data for ``rule`` as saved, with ``fields`` changed."""
    values = {"name": rule.name, "plan": rule.plan_id or "", "scope": rule.scope,
              "endpoint": rule.endpoint, "kind": rule.kind, "calendar_period": "",
              "rate": rule.rate, "period_s": rule.period_s, "burst": rule.burst,
              "counts": rule.counts, "lease": rule.lease, "mode": rule.mode,
              "on_redis_failure": rule.on_redis_failure, "enabled": "on", **fields}
    return {name: str(value) for name, value in values.items()}


def test_every_save_by_code_is_recorded_against_the_previous_entry(config):
    entry = latest()
    assert entry.source == AuditSource.CODE and entry.actor == "application code"
    assert entry.summary == "added plan assignment “carol”"
    assert entry.diff[0]["item"] == {"user": "carol", "plan": "free", "tenant": "acme",
                                     "starts_at": None, "ends_at": None, "reason": ""}
    assert audit.document_of(entry) == audit.audit_document()
    assert entry.previous.summary == "added endpoint cost (endpoint api:search, method GET)"


def test_an_admin_edit_records_one_entry_with_its_diff_and_user(config, admin_client):
    rule = Rule.objects.get(name="free-user")
    before = AuditEntry.objects.count()
    url = reverse("admin:ratelimit_app_rule_change", args=[rule.pk])
    response = admin_client.post(url, rule_post(rule, burst=40, rate=120))
    assert response.status_code == 302
    assert AuditEntry.objects.count() == before + 1
    entry = latest()
    assert (entry.actor, entry.user.username, entry.source) == ("admin", "admin", "admin")
    assert entry.diff == [{"action": "change", "section": "rules", "label": "rule “free-user”",
                           "token": "rules|free-user", "key": ["free-user"], "row": rule.pk,
                           "fields": {"rate": [60, 120], "burst": [30, 40]}}]
    assert entry.summary == "rule “free-user”: rate 60 → 120; burst 30 → 40"
    assert audit.document_of(entry) == audit.audit_document()

    # the change page links to the object's history, which lists the entry
    page = admin_client.get(url).content.decode()
    history = reverse("admin:ratelimit_monitoring_auditentry_changelist") + "?touched=rules%7Cfree-user"
    assert f'href="{history}"' in page
    listed = admin_client.get(history).content.decode()
    assert "rate 60 → 120; burst 30 → 40" in listed
    assert "added endpoint cost" not in listed  # another object's entry


def test_a_plan_saved_with_its_inline_costs_is_one_entry(config, admin_client):
    plan = Plan.objects.get(slug="free")
    data = {"slug": "free", "name": "Free tier", "description": "",
            "default_for_anonymous": "on",
            "costs-TOTAL_FORMS": "2", "costs-INITIAL_FORMS": "0", "costs-MIN_NUM_FORMS": "0",
            "costs-MAX_NUM_FORMS": "1000"}
    for i, endpoint in enumerate(["api:items", "api:reports"]):
        data.update({f"costs-{i}-plan": plan.pk, f"costs-{i}-id": "",
                     f"costs-{i}-endpoint": endpoint, f"costs-{i}-method": "GET",
                     f"costs-{i}-cost": "2", f"costs-{i}-minimum": "0"})
    before = AuditEntry.objects.count()
    response = admin_client.post(reverse("admin:ratelimit_app_plan_change", args=[plan.pk]),
                                 data)
    assert response.status_code == 302
    assert AuditEntry.objects.count() == before + 1
    labels = [change["label"] for change in latest().diff]
    assert labels[0] == "plan “free”" and len(labels) == 3, labels


def test_an_import_is_one_entry_named_after_the_command(config, tmp_path):
    document = export_document()
    document["rules"][1]["burst"] = 45          # free-user
    document["endpoint_costs"] = []             # removes api:search
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps(document))
    before = AuditEntry.objects.count()
    call_command("ratelimit", "import", str(path), stdout=io.StringIO())
    assert AuditEntry.objects.count() == before + 1
    entry = latest()
    assert (entry.actor, entry.source, entry.user) == ("manage.py ratelimit import", "import",
                                                       None)
    assert [(c["action"], c["label"]) for c in entry.diff] == [
        ("change", "rule “free-user”"), ("remove", "endpoint cost (endpoint api:search, "
                                                   "method GET)")]


def test_a_rolled_back_change_is_not_recorded(config):
    before = AuditEntry.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        Rule.objects.filter(name="free-user").get().delete()
        raise RuntimeError
    assert AuditEntry.objects.count() == before


def test_an_update_is_recorded_once_by_the_worker_that_notices_it(config, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_RELOAD_INTERVAL_S": 30}
    clock = use_fake_clock()
    request = RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.7")

    def decide(worker):
        return {p.name: p.burst for p in worker.decide(request, AnonymousUser(), "hello")
                .policies}

    other = Limiter.from_settings(clock, metrics_autostart=False)
    try:
        assert decide(limiter()) == decide(other) == {"free-ip": 1000}
        before = AuditEntry.objects.count()
        Rule.objects.filter(name="free-ip").update(burst=9)  # no signal, no entry
        assert AuditEntry.objects.count() == before
        with CaptureQueriesContext(connection) as captured:
            clock.advance(29_000)
            assert decide(limiter()) == {"free-ip": 1000}  # not noticed yet: from memory
        assert captured.captured_queries == []

        clock.advance(1001)
        assert decide(limiter()) == {"free-ip": 9}
        assert AuditEntry.objects.count() == before + 1
        entry = latest()
        assert (entry.actor, entry.source, entry.user) == ("outside the app", "outside", None)
        assert entry.diff == [{"action": "change", "section": "rules",
                               "label": "rule “free-ip”", "token": "rules|free-ip",
                               "key": ["free-ip"], "row": Rule.objects.get(name="free-ip").pk,
                               "fields": {"burst": [1000, 9]}}]
        decide(other)  # the other worker reloads on the announced version: no second entry
        assert decide(other) == {"free-ip": 9}
        assert AuditEntry.objects.count() == before + 1
    finally:
        other.close()


def test_a_restore_brings_back_the_old_export_with_one_version_bump(config, admin_client,
                                                                    version_writes):
    old = latest()
    old_export = export_document()
    Rule.objects.filter(name="free-user").update(burst=99)   # unannounced, not yet noticed
    Rule.objects.create(name="extra", scope=Scope.IP, rate=1, period_s=1, burst=1)
    EndpointCost.objects.all().delete()
    IdentityOverride.objects.create(ip="192.0.2.1", exempt=True)
    version_writes.clear()

    url = reverse("admin:ratelimit_monitoring_auditentry_restore", args=[old.pk])
    page = admin_client.get(url).content.decode()
    assert "Dry run" in page and "burst: 99 → 30" in page and "- rule “extra”" in page
    assert export_document() != old_export  # the dry run changed nothing
    assert version_writes == []

    response = admin_client.post(url, {"confirm": "yes"})
    assert response.status_code == 302
    assert export_document() == old_export
    assert len(version_writes) == 1
    restored = latest()
    assert (restored.source, restored.actor, restored.restored_from) == ("restore", "admin", old)
    assert restored.summary.startswith(f"restored entry #{old.pk}: ")
    assert audit.document_of(restored) == audit.document_of(old)


def test_a_restore_of_an_entry_of_every_caller_warns_and_restores_it(config, admin_client):
    AccessListEntry.objects.create(kind="deny", target="ip", value="0.0.0.0/0",
                                   reason="maintenance")
    old = latest()
    AccessListEntry.objects.all().delete()
    url = reverse("admin:ratelimit_monitoring_auditentry_restore", args=[old.pk])
    page = admin_client.get(url).content.decode()
    assert "Warning: access_lists[0] (list entry (kind deny, target ip, value 0.0.0.0/0)): " \
           "A deny entry for 0.0.0.0/0 refuses every IPv4 caller" in page
    assert admin_client.post(url, {"confirm": "yes"}).status_code == 302
    assert AccessListEntry.objects.get().value == "0.0.0.0/0"


def test_a_restore_that_names_a_deleted_user_says_so_and_changes_nothing(config, admin_client):
    old = latest()
    PlanAssignment.objects.all().delete()
    User.objects.filter(username="carol").delete()
    url = reverse("admin:ratelimit_monitoring_auditentry_restore", args=[old.pk])
    for response in (admin_client.get(url), admin_client.post(url, {"confirm": "yes"})):
        page = response.content.decode()
        assert "cannot be restored" in page
        assert "no user with username “carol”" in page
    assert not PlanAssignment.objects.exists()


def test_the_trail_is_read_only_and_restoring_needs_its_permission(config, client):
    staff = User.objects.create_user("viewer", password="x", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_auditentry"))
    client.force_login(staff)
    changelist = reverse("admin:ratelimit_monitoring_auditentry_changelist")
    assert client.get(changelist).status_code == 200
    entry = latest()
    restore = reverse("admin:ratelimit_monitoring_auditentry_restore", args=[entry.pk])
    assert client.get(restore).status_code == 403
    assert client.post(reverse("admin:ratelimit_monitoring_auditentry_delete", args=[entry.pk]),
                       {"post": "yes"}).status_code == 403
    assert AuditEntry.objects.filter(pk=entry.pk).exists()
