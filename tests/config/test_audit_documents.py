"""An audit entry in proportion to its change (config/audit_documents.py): a save reads its own
rows, the entry stores its diff, every CHECKPOINT_EVERY-th entry the whole configuration, and
the configuration of any entry is rebuilt from its checkpoint; what cannot be patched is
exported whole.

Real commits (``transaction=True``): entries are recorded when a transaction commits.
"""

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ratelimit_app.config import audit, audit_documents
from ratelimit_app.config.quotas_as_code import QuotaFileError
from ratelimit_app.models import (
    AuditEntry,
    AuditSource,
    IdentityOverride,
    Plan,
    PlanAssignment,
    Rule,
    Scope,
)

from .test_audit import latest

pytestmark = pytest.mark.django_db(transaction=True)

RULES = 30


@pytest.fixture
def rules():
    """A plan with RULES rules, an assignment and an override, saved by code."""
    plan = Plan.objects.create(slug="free", name="Free")
    made = [Rule.objects.create(name=f"rule-{n}", plan=plan, scope=Scope.USER, rate=10,
                                period_s=60, burst=10) for n in range(RULES)]
    carol = User.objects.create(username="carol")
    PlanAssignment.objects.create(user=carol, plan=plan)
    IdentityOverride.objects.create(user=carol, rule=made[0], burst=99)
    return made


def rule_reads(queries):
    """The SELECTs of the rules table among ``queries``."""
    return [q["sql"] for q in queries
            if q["sql"].startswith("SELECT") and 'FROM "ratelimit_app_rule"' in q["sql"]]


def test_a_save_reads_its_own_row_and_stores_only_its_diff(rules):
    rule = rules[5]
    rule.burst = 20
    with CaptureQueriesContext(connection) as captured:
        rule.save()
    entry = latest()
    assert entry.summary == "rule “rule-5”: burst 10 → 20"
    assert entry.snapshot is None  # not a checkpoint: the diff alone
    assert entry.diff == [{"action": "change", "section": "rules", "label": "rule “rule-5”",
                           "token": "rules|rule-5", "key": ["rule-5"], "row": rule.pk,
                           "fields": {"burst": [10, 20]}}]
    # the rules table read for that row alone
    reads = rule_reads(captured.captured_queries)
    assert len(reads) == 1 and "WHERE" in reads[0]
    assert audit.document_of(entry) == audit.audit_document()


def test_each_entry_is_rebuilt_and_every_fiftieth_is_a_checkpoint(rules):
    expected = {}
    for n in range(audit_documents.CHECKPOINT_EVERY + 5):
        rule = rules[n % RULES]
        rule.rate += 1
        rule.save()
        expected[latest().pk] = audit.audit_document()
    ids = sorted(expected)
    checkpoints = list(AuditEntry.objects.filter(snapshot__isnull=False)
                       .order_by("id").values_list("id", flat=True))
    # at most CHECKPOINT_EVERY entries from one checkpoint to the next
    assert all(b - a <= audit_documents.CHECKPOINT_EVERY
               for a, b in zip(checkpoints, checkpoints[1:] + [ids[-1] + 1]))
    assert any(checkpoint in expected for checkpoint in checkpoints)
    for entry in AuditEntry.objects.filter(id__in=ids):
        assert audit.document_of(entry) == expected[entry.pk], entry.pk


def test_a_removal_and_an_addition_are_patched(rules):
    rules[3].delete()
    removed = latest()
    assert [c["action"] for c in removed.diff] == ["remove"] and removed.snapshot is None
    Rule.objects.create(name="new-one", scope=Scope.IP, rate=1, period_s=1, burst=1)
    added = latest()
    assert added.summary == "added rule “new-one”" and added.snapshot is None
    assert audit.document_of(added) == audit.audit_document()
    # the deleted rule's override went with it (a cascade: its own signal, the same entry)
    rules[0].delete()
    both = latest()
    assert sorted(c["section"] for c in both.diff) == ["identity_overrides", "rules"]
    assert audit.document_of(both) == audit.audit_document()


def test_what_cannot_be_patched_is_exported_whole_as_a_checkpoint(rules):
    # a rule renamed: the override names it, without a signal of its own
    rule = rules[0]
    rule.name = "renamed"
    rule.save()
    entry = latest()
    assert entry.snapshot == audit.audit_document()
    assert "identity_overrides" in {c["section"] for c in entry.diff}
    # a plan's change: other sections name plans
    plan = Plan.objects.get()
    plan.name = "Free tier"
    plan.save()
    assert latest().snapshot == audit.audit_document()
    # a username changed (no quota row): the next whole export records it
    User.objects.filter(username="carol").update(username="caroline")
    rules[1].burst = 11
    rules[1].save()
    assert [c["section"] for c in latest().diff] == ["rules"]
    audit.record(audit.Actor("outside the app", AuditSource.OUTSIDE))  # a whole comparison
    assert latest().snapshot == audit.audit_document()
    assert "caroline" in str(latest().diff)


def test_another_recorder_entries_are_followed_from_their_diffs(rules):
    other = audit.Recorder()  # another process's: it knows nothing yet
    rules[1].burst = 11
    rules[1].save()  # this process's recorder: patched
    Rule.objects.filter(pk=rules[2].pk).update(burst=12)
    entry = other.record(audit.Actor("other", AuditSource.CODE),
                         changes={"rule": frozenset({rules[2].pk})})
    assert entry.snapshot is not None  # its first entry: a whole export
    Rule.objects.filter(pk=rules[3].pk).update(burst=13)
    entry = other.record(audit.Actor("other", AuditSource.CODE),
                         changes={"rule": frozenset({rules[3].pk})})
    assert entry.snapshot is None  # then patched
    # this process's recorder follows the other's two entries from their diffs
    rules[4].burst = 14
    with CaptureQueriesContext(connection) as captured:
        rules[4].save()
    assert latest().snapshot is None and latest().summary == "rule “rule-4”: burst 10 → 14"
    assert len(rule_reads(captured.captured_queries)) == 1
    assert audit.document_of(latest()) == audit.audit_document()


def test_a_trail_with_an_entry_gone_says_so_and_goes_on(rules):
    for burst in (11, 12, 13):
        rules[1].burst = burst
        rules[1].save()
    entries = list(AuditEntry.objects.order_by("-id")[:3])
    assert all(entry.snapshot is None for entry in entries)
    entries[1].delete()  # its follower's previous entry is now NULL
    with pytest.raises(audit.AuditTrailGap, match=f"#{entries[0].pk}"):
        audit.document_of(entries[0])
    with pytest.raises(QuotaFileError, match="cannot be rebuilt"):
        audit.restore_plan(entries[0])
    # the next entry is a checkpoint: the entries after it can be rebuilt again
    rules[2].burst = 22
    rules[2].save()
    assert latest().snapshot == audit.audit_document()
    rules[2].burst = 23
    rules[2].save()
    assert latest().snapshot is None
    assert audit.document_of(latest()) == audit.audit_document()
