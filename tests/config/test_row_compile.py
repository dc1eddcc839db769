"""An edit of a few rows costs a compile of those rows, not of their tables.

A save names its rows in the version it publishes (``rule:12``, config/changes.py); a worker
reads those rows alone, by primary key, and patches them into the snapshot it holds, and into
the digest of the rows its comparison checks. Both must equal what reading everything gives,
whatever the edit: a change, a new row, a deleted or disabled one, a row that moves to another
user, a dated row.
"""

import dataclasses
from datetime import datetime, timezone

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ratelimit_app.config.changes import MAX_ROWS_NAMED, add_row, by_table
from ratelimit_app.config.versions import published_ms
from ratelimit_app.config.compiler import compile_snapshot, config_models
from ratelimit_app.config.fingerprint import changed_rows, config_fingerprint
from ratelimit_app.models import (ApiKey, Counts, IdentityOverride, Kind, Plan, PlanAssignment,
                                  Rule, Scope)

from ..helpers import limiter
from .test_incremental_compile import CHANGES_KEY, NOW, T0, ip_request, worker

pytestmark = pytest.mark.django_db


def compared(snapshot):
    """What a snapshot holds, without its memos and labels (its RowIndexes and moments kept:
    a patch must leave them as a compile of everything makes them)."""
    fields = dataclasses.asdict(snapshot)
    for name in ("version", "compiled_at", "_rules_for", "buckets_memo"):
        fields.pop(name)
    return fields


def config_queries(captured):
    """The captured queries that read a config table."""
    tables = [model._meta.db_table for model in config_models()]
    return [query["sql"] for query in captured.captured_queries
            if any(f'FROM "{table}"' in query["sql"] for table in tables)]


def at(seconds):
    return datetime.fromtimestamp(NOW + seconds, tz=timezone.utc)


@pytest.fixture
def rows():
    """A plan with many rules, users with assignments and keys, and overrides: the tables a
    one-row edit must not read whole."""
    free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    pro = Plan.objects.create(slug="pro", name="Pro")
    Rule.objects.bulk_create([Rule(name=f"r{i}", plan=free, scope=Scope.IP, rate=1, period_s=60,
                                   burst=10 + i) for i in range(30)])
    users = User.objects.bulk_create([User(username=f"u{i}") for i in range(6)])
    PlanAssignment.objects.bulk_create(
        [PlanAssignment(user=user, plan=free, tenant=f"t{i}") for i, user in enumerate(users[:4])])
    for i, user in enumerate(users[:3]):
        ApiKey.create_key(user, f"key{i}", raw_key=f"rk_row_{i}", plan=pro)
    IdentityOverride.objects.create(ip="192.0.2.1", exempt=True)
    IdentityOverride.objects.create(user=users[0], rate=5, period_s=1, burst=5)
    return {"free": free, "pro": pro, "users": users}


def patched(base, changes):
    """Compile ``changes`` into ``base``; check it reads only the rows named (one query per
    table, by primary key) and equals a compile of everything."""
    with CaptureQueriesContext(connection) as captured:
        snapshot = compile_snapshot("v2", NOW, base=base, changed=changes)
    queries = config_queries(captured)
    assert len(queries) == len(by_table(changes)), queries
    assert all(" IN (" in sql for sql in queries), queries
    assert compared(snapshot) == compared(compile_snapshot("v2", NOW))
    return snapshot


def test_a_rule_changed_created_disabled_and_deleted_is_patched_in(rows):
    base = compile_snapshot("v1", NOW)
    first, second = Rule.objects.order_by("id")[:2]
    Rule.objects.filter(pk=first.pk).update(burst=99)
    snapshot = patched(base, {f"rule:{first.pk}"})
    assert snapshot.rules[0].burst == 99 and snapshot.rules[1] is base.rules[1]  # kept as is
    new = Rule.objects.create(name="new", plan=rows["pro"], scope=Scope.USER, rate=2,
                              period_s=1, burst=2, alert_thresholds="80")
    snapshot = patched(snapshot, {f"rule:{new.pk}"})
    assert snapshot.rules[-1].name == "new" and snapshot.has_alerts
    Rule.objects.filter(pk=second.pk).update(enabled=False)
    deleted = new.pk
    new.delete()
    snapshot = patched(snapshot, {f"rule:{second.pk}", f"rule:{deleted}"})
    assert [r.id for r in snapshot.rules] == sorted(
        Rule.objects.filter(enabled=True).values_list("id", flat=True))
    assert not snapshot.has_alerts


def test_the_rules_counting_failed_authentications_and_those_alerting_are_patched_too(rows):
    """The tuples of the rules that count failed authentications and of those whose alerts
    the request path checks are patched by id as the rules are (each a subset of them, in id
    order): a rule joining, leaving or changing either one."""
    base = compile_snapshot("v1", NOW)
    first, second, third = Rule.objects.order_by("id")[:3]
    Rule.objects.filter(pk__in=[first.pk, third.pk]).update(counts=Counts.FAILED_AUTH)
    Rule.objects.filter(pk=second.pk).update(alert_thresholds="50,90")
    snapshot = patched(base, {f"rule:{first.pk}", f"rule:{second.pk}", f"rule:{third.pk}"})
    assert [r.id for r in snapshot.failed_auth_rules] == [first.pk, third.pk]
    assert [r.id for r in snapshot.alerting_rules] == [second.pk] and snapshot.has_alerts
    # a credit balance's thresholds are its checkpoint's, not the request path's
    Rule.objects.filter(pk=second.pk).update(kind=Kind.CREDITS)
    Rule.objects.filter(pk=first.pk).update(counts=Counts.REQUESTS, burst=77)
    snapshot = patched(snapshot, {f"rule:{first.pk}", f"rule:{second.pk}"})
    assert [r.id for r in snapshot.failed_auth_rules] == [third.pk]
    assert snapshot.alerting_rules == () and not snapshot.has_alerts
    Rule.objects.filter(pk=third.pk).delete()
    snapshot = patched(snapshot, {f"rule:{third.pk}"})
    assert snapshot.failed_auth_rules == ()


def test_assignments_are_patched_when_one_moves_to_another_user_or_gets_dates(rows):
    users = rows["users"]
    base = compile_snapshot("v1", NOW)
    moved = PlanAssignment.objects.get(user=users[1])
    PlanAssignment.objects.filter(pk=moved.pk).update(user=users[5], plan=rows["pro"])
    snapshot = patched(base, {f"planassignment:{moved.pk}"})
    assert str(users[1].pk) not in snapshot.assignments  # its old user's entry is gone
    assert snapshot.assignments[str(users[5].pk)] == ("pro", "t1")
    dated = PlanAssignment.objects.create(user=users[4], plan=rows["pro"], starts_at=at(10),
                                          ends_at=at(20))
    snapshot = patched(snapshot, {f"planassignment:{dated.pk}"})
    assert str(users[4].pk) not in snapshot.assignments and snapshot.next_change_at == NOW + 10
    PlanAssignment.objects.filter(pk=dated.pk).delete()  # (keeps dated.pk)
    snapshot = patched(snapshot, {f"planassignment:{dated.pk}"})
    assert snapshot.next_change_at == float("inf")


def test_api_keys_are_patched_when_created_deactivated_or_dated(rows):
    base = compile_snapshot("v1", NOW)
    key, _ = ApiKey.create_key(rows["users"][3], "new", raw_key="rk_row_new", plan=rows["pro"])
    snapshot = patched(base, {f"apikey:{key.pk}"})
    assert snapshot.api_keys[key.digest].plan == "pro"
    ApiKey.objects.filter(pk=key.pk).update(starts_at=at(5))
    snapshot = patched(snapshot, {f"apikey:{key.pk}"})
    assert snapshot.api_keys[key.digest].plan is None and snapshot.next_change_at == NOW + 5
    # at the moment, the dated parts are read whole
    later = compile_snapshot("v2", NOW + 5, base=snapshot, changed=set())
    assert later.api_keys[key.digest].plan == "pro"
    assert compared(later) == compared(compile_snapshot("v2", NOW + 5))
    ApiKey.objects.filter(pk=key.pk).update(active=False)
    snapshot = patched(snapshot, {f"apikey:{key.pk}"})
    assert key.digest not in snapshot.api_keys


def test_overrides_are_patched_in_their_order(rows):
    users = rows["users"]
    base = compile_snapshot("v1", NOW)
    dated = IdentityOverride.objects.create(user=users[0], rate=9, period_s=1, burst=9,
                                            starts_at=at(-5), ends_at=at(30))
    permanent = IdentityOverride.objects.create(user=users[0], rate=7, period_s=1, burst=7)
    snapshot = patched(base, {f"identityoverride:{dated.pk}", f"identityoverride:{permanent.pk}"})
    # the dated one applies last, though it was created first
    assert [e.rate for e in snapshot.overrides[("user", str(users[0].pk))]] == [5, 7, 9]
    assert snapshot.next_change_at == NOW + 30
    IdentityOverride.objects.filter(pk=dated.pk).delete()
    snapshot = patched(snapshot, {f"identityoverride:{dated.pk}"})
    assert [e.rate for e in snapshot.overrides[("user", str(users[0].pk))]] == [5, 7]


# --- the digest of the rows ---------------------------------------------------------------------

def test_the_digest_of_a_few_rows_patched_in_equals_the_whole_digest(rows):
    whole = config_fingerprint()
    rule = Rule.objects.order_by("id").first()
    Rule.objects.filter(pk=rule.pk).update(burst=1234)
    new = Rule.objects.create(name="new", plan=rows["free"], scope=Scope.IP, rate=1,
                              period_s=1, burst=1)
    override = IdentityOverride.objects.get(ip="192.0.2.1").pk
    IdentityOverride.objects.filter(pk=override).delete()
    changes = {f"rule:{rule.pk}", f"rule:{new.pk}", f"identityoverride:{override}"}
    with CaptureQueriesContext(connection) as captured:
        partial = config_fingerprint(parts=changes, base=whole)
    assert len(config_queries(captured)) == 2  # one per table, by primary key
    assert {**whole, **partial} == config_fingerprint()
    # and the comparison says which rows differ
    assert changed_rows(whole, config_fingerprint()) == changes


def test_a_comparison_names_a_table_when_too_many_of_its_rows_differ(rows):
    whole = config_fingerprint()
    Rule.objects.bulk_create([Rule(name=f"more{i}", plan=rows["free"], scope=Scope.IP, rate=1,
                                   period_s=1, burst=1) for i in range(MAX_ROWS_NAMED + 1)])
    assert changed_rows(whole, config_fingerprint()) == {"rule"}


def test_changes_name_rows_until_there_are_too_many():
    changes = set()
    for pk in range(MAX_ROWS_NAMED):
        add_row(changes, "apikey", pk)
    add_row(changes, "rule", 7)
    assert len(changes) == MAX_ROWS_NAMED + 1 and by_table(changes)["rule"] == {7}
    add_row(changes, "apikey", MAX_ROWS_NAMED)
    assert changes == {"apikey", "rule:7"}
    add_row(changes, "apikey", 1)
    assert changes == {"apikey", "rule:7"}
    add_row(changes, "rule", None)  # a row without a key: its table
    assert by_table(changes) == {"apikey": None, "rule": None}


def test_a_key_in_other_digits_reads_its_table_whole():
    # str.isdigit() holds for "²", which int() refuses
    assert by_table({"rule:²", "plan:３"}) == {"rule": None, "plan": None}
    assert published_ms("²-1") == -1 and published_ms("17-1") == 17


# --- through the workers ----------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_save_of_one_rule_makes_every_worker_read_that_rule_alone(rows, redis_client):
    limiter().bump_config_version()
    other = worker()
    try:
        other.snapshot()
        rule = Rule.objects.get(name="r0")
        rule.burst = 77
        rule.save()  # publishes at its commit
        assert redis_client.lindex(CHANGES_KEY, 0).decode().split(" ")[1] == f"rule:{rule.pk}"
        with CaptureQueriesContext(connection) as captured:
            decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert other.policies.last_compile == [f"rule:{rule.pk}"]
        assert len(config_queries(captured)) == 2  # the rule, and its digest
        assert {p.name: p.burst for p in decision.policies}["r0"] == 77
        assert compared(other.snapshot()) == compared(compile_snapshot("x", NOW))
        assert other.policies.fingerprint == config_fingerprint()
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_transaction_of_many_rows_names_their_table(rows, redis_client):
    with transaction.atomic():
        for i in range(MAX_ROWS_NAMED + 1):
            Rule.objects.create(name=f"more{i}", plan=rows["free"], scope=Scope.IP, rate=1,
                                period_s=1, burst=1)
    assert redis_client.lindex(CHANGES_KEY, 0).decode().split(" ")[1] == "rule"


@pytest.mark.django_db(transaction=True)
def test_an_outside_update_is_announced_by_its_rows(rows, redis_client):
    limiter().bump_config_version()
    other = worker()
    try:
        other.snapshot()
        rule = Rule.objects.get(name="r3")
        Rule.objects.filter(pk=rule.pk).update(burst=5)  # no signal
        other.policies._compare_with(other.policies.snapshot)
        assert redis_client.lindex(CHANGES_KEY, 0).decode().split(" ")[1] == f"rule:{rule.pk}"
        other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert other.policies.last_compile == [f"rule:{rule.pk}"]
        assert compared(other.snapshot()) == compared(compile_snapshot("x", NOW))
    finally:
        other.close()
