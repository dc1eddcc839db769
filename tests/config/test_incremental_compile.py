"""An edit costs a compile in proportion to the tables it changed.

Each published version records which tables it changed (``rl:config:changes``); a worker reads
again only the parts of its snapshot those tables feed, and takes the others from the snapshot
it holds. What it compiles must equal a compile of everything. (The rows an edit names, read
alone and patched in: test_row_compile.py.)
"""

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from ratelimit_app.config.compiler import (DATED_PARTS, PARTS, compile_snapshot, config_models,
                                           parts_to_read)
from ratelimit_app.config.fingerprint import config_fingerprint
from ratelimit_app.decision import keys
from ratelimit_app.models import (ApiKey, EndpointCost, IdentityOverride, Plan, PlanAssignment,
                                  Rule, Scope)
from ratelimit_app.runtime.limiter import Limiter

from ..helpers import FakeClock, limiter

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000_000
NOW = T0 / 1000
CHANGES_KEY = keys.config_changes_key("rl")


def compared(snapshot):
    """What a snapshot holds, without its memos and labels."""
    fields = dataclasses.asdict(snapshot)
    for name in ("version", "compiled_at", "_rules_for", "part_moments", "part_rows",
                 "buckets_memo"):
        fields.pop(name)
    return fields


def tables_read(captured):
    """The config tables the captured queries read (FROM, not a JOIN for a plan's slug)."""
    tables = {model._meta.db_table for model in config_models()}
    return {table for query in captured.captured_queries for table in tables
            if f'FROM "{table}"' in query["sql"]}


@pytest.fixture
def rows():
    free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="free-ip", plan=free, scope=Scope.IP, rate=1, period_s=60,
                        burst=10)
    EndpointCost.objects.create(endpoint="hello", cost=2)
    EndpointCost.objects.create(endpoint="chat", cost=5, metered=True, minimum=1)
    IdentityOverride.objects.create(ip="192.0.2.1", exempt=True)
    return free


def test_a_rule_edit_reads_the_rules_alone_and_compiles_what_a_full_compile_does(rows):
    base = compile_snapshot("v1", NOW)
    Rule.objects.filter(name="free-ip").update(burst=20)
    with CaptureQueriesContext(connection) as captured:
        partial = compile_snapshot("v2", NOW, base=base, changed={"rule"})
    assert tables_read(captured) == {"ratelimit_app_rule"}
    assert compared(partial) == compared(compile_snapshot("v2", NOW))
    assert partial.rules[0].burst == 20 and partial.costs is base.costs  # taken, not read


def test_no_table_changed_reads_nothing():
    base = compile_snapshot("v1", NOW)
    with CaptureQueriesContext(connection) as captured:
        relabelled = compile_snapshot("v2", NOW, base=base, changed=set())
    assert [q for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]] == []
    assert relabelled.version == "v2" and compared(relabelled) == compared(base)


def test_which_parts_a_compile_reads():
    base = compile_snapshot("v1", NOW)
    everything = dict.fromkeys(PARTS)  # each part read whole
    assert parts_to_read(None, {"rule"}, NOW) == everything          # nothing to build on
    assert parts_to_read(base, None, NOW) == everything              # changes unknown
    assert parts_to_read(base, {"plan"}, NOW) == everything          # slugs read everywhere
    assert parts_to_read(base, {"plan:3", "rule:1"}, NOW) == everything
    assert parts_to_read(base, {"rule", "apikey"}, NOW) == {"rule": None, "apikey": None}
    # rows: read alone and patched in; a table named whole as well is read whole
    assert parts_to_read(base, {"rule:1", "rule:12", "apikey:4"}, NOW) == \
        {"rule": {1, 12}, "apikey": {4}}
    assert parts_to_read(base, {"rule:1", "rule"}, NOW) == {"rule": None}
    # the endpoint costs are read whole (a row per priced endpoint)
    assert parts_to_read(base, {"endpointcost:2"}, NOW) == {"endpointcost": None}
    dated = dataclasses.replace(base, next_change_at=NOW + 5)
    assert parts_to_read(dated, {"rule:1"}, NOW + 5) == \
        {"rule": {1}, **dict.fromkeys(DATED_PARTS)}  # a moment passed: the dated parts whole
    assert parts_to_read(dated, {"rule"}, NOW + 4) == {"rule": None}


def test_a_partial_compile_after_a_moment_reads_the_dated_rows_at_that_moment(rows):
    user = User.objects.create(username="dated")
    start = datetime.fromtimestamp(NOW + 10, tz=timezone.utc)
    PlanAssignment.objects.create(user=user, plan=rows, starts_at=start,
                                  ends_at=start + timedelta(seconds=10))
    base = compile_snapshot("v1", NOW)
    assert base.assignments == {} and base.next_change_at == NOW + 10
    later = compile_snapshot("v1", NOW + 10, base=base, changed=set())
    assert later.assignments == {str(user.pk): ("free", "")}
    assert later.next_change_at == NOW + 20
    assert compared(later) == compared(compile_snapshot("v1", NOW + 10))


def test_each_table_has_a_digest_and_one_table_can_be_digested_alone(rows):
    whole = config_fingerprint()
    assert set(whole) == set(PARTS)
    assert config_fingerprint(parts={"rule"}) == {"rule": whole["rule"]}
    Rule.objects.filter(name="free-ip").update(burst=30)
    after = config_fingerprint()
    assert {part for part in after if after[part] != whole[part]} == {"rule"}


def test_a_tables_digest_is_the_same_whichever_tables_are_read_with_it(rows):
    """The query pads narrower tables to the widest it reads: the padding must not enter a
    table's digest, or a worker that compiled some tables again would find the others changed
    at its next comparison of the rows, and announce a change nobody made."""
    user = User.objects.create(username="ann")
    PlanAssignment.objects.create(user=user, plan=rows)
    ApiKey.create_key(user, "ci", raw_key="rk_digest_test", plan=rows)
    whole = config_fingerprint()
    for part in PARTS:
        assert config_fingerprint(parts={part}) == {part: whole[part]}, part
        for other in PARTS:
            assert config_fingerprint(parts={part, other})[part] == whole[part], (part, other)


def test_after_compiling_one_narrow_table_again_the_rows_compare_unchanged(rows, redis_client):
    limiter().bump_config_version()
    other = worker()
    try:
        other.snapshot()
        IdentityOverride.objects.filter(ip="192.0.2.1").update(exempt=False, burst=5)
        published = limiter().bump_config_version({"identityoverride"})
        other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)  # fenced: compiles
        assert other.snapshot().version == published
        assert other.policies.last_compile == ["identityoverride"]
        other.policies._compare_with(other.policies.snapshot)
        # nothing changed since: no announcement, no reload
        assert limiter().read_version() == published and not other.policies.stale
    finally:
        other.close()


# --- the record of changes and the workers ------------------------------------------------------

def worker():
    return Limiter.from_settings(FakeClock(T0), metrics_autostart=False)


def ip_request():
    return RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.7")


def test_a_worker_reads_only_the_tables_the_versions_since_its_own_changed(rows, redis_client):
    limiter().bump_config_version()
    other = worker()
    try:
        other.snapshot()
        assert other.policies.last_compile == "everything"  # its first compile
        Rule.objects.filter(name="free-ip").update(burst=20)
        limiter().bump_config_version({"rule"})              # what a rule's save publishes
        EndpointCost.objects.filter(endpoint="hello").update(cost=3)
        published = limiter().bump_config_version({"endpointcost"})
        assert [e.split(" ")[1] for e in
                map(bytes.decode, redis_client.lrange(CHANGES_KEY, 0, 1))] == \
            ["endpointcost", "rule"]
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert other.snapshot().version == published
        assert other.policies.last_compile == ["endpointcost", "rule"]  # both, nothing else
        assert decision.policies[0].burst == 20 and decision.cost == 3
        assert compared(other.snapshot()) == compared(compile_snapshot("x", NOW))
    finally:
        other.close()


def test_a_worker_older_than_the_record_compiles_everything(rows, redis_client):
    limiter().bump_config_version()
    other = worker()
    try:
        other.snapshot()
        redis_client.delete(CHANGES_KEY)  # e.g. more versions than the record keeps
        limiter().bump_config_version({"rule"})
        other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert other.policies.last_compile == "everything"
    finally:
        other.close()


def test_a_reset_changes_no_table_and_workers_compile_nothing(rows):
    limiter().bump_config_version()
    other = worker()
    try:
        held = other.snapshot()
        limiter().reset([])
        other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert other.policies.last_compile == []
        assert other.snapshot().version != held.version
        assert other.snapshot().rules is held.rules
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_save_publishes_the_tables_of_its_transaction(redis_client):
    plan = Plan.objects.create(slug="pro", name="Pro")
    Rule.objects.create(name="pro-ip", plan=plan, scope=Scope.IP, rate=1, period_s=60, burst=5)
    newest, before = [entry.decode().split(" ") for entry in redis_client.lrange(CHANGES_KEY, 0, 1)]
    rule = Rule.objects.get(name="pro-ip")
    # each commit names its own rows
    assert newest == [limiter().read_version(), f"rule:{rule.pk}"]
    assert before[1] == f"plan:{plan.pk}"
