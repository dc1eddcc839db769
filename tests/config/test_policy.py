"""Policy snapshot: which rules apply, what a request costs, overrides, disabled and shadow rules,
reloading on a new config version, and surviving a database error."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.test import RequestFactory

from ratelimit_app.config.snapshot import Snapshot
from ratelimit_app.models import (
    EndpointCost,
    FailureMode,
    IdentityOverride,
    Mode,
    Plan,
    PlanAssignment,
    Rule,
    Scope,
)

from ..helpers import decide, limiter, make_rule

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000_000  # a fixed "now" in ms for the Lua script


def add_plan(slug, **flags):
    return Plan.objects.create(slug=slug, name=slug.title(), **flags)


def add_rule(name, plan=None, scope=Scope.USER, endpoint="", rate=100, period_s=60, burst=100,
             **fields):
    return Rule.objects.create(name=name, plan=plan, scope=scope, endpoint=endpoint, rate=rate,
                               period_s=period_s, burst=burst, **fields)


def add_user(username, plan=None):
    user = get_user_model().objects.create(username=username)
    if plan is not None:
        PlanAssignment.objects.create(user=user, plan=plan)
    return user


def request_from(ip="203.0.113.7", method="GET"):
    return RequestFactory().generic(method, "/api/items/", REMOTE_ADDR=ip)


def names(rules):
    return sorted(r.name for r in rules)


# --- rules_for ---------------------------------------------------------------------------------

def test_rules_for_filters_by_plan_and_endpoint():
    free, pro = add_plan("free"), add_plan("pro")
    add_rule("everyone", scope=Scope.GLOBAL)
    add_rule("free-user", free)
    add_rule("pro-user", pro)
    add_rule("free-search", free, endpoint="api:search")
    add_rule("any-search", endpoint="api:search")
    snapshot = limiter().snapshot()

    assert names(snapshot.rules_for("free", "api:items")) == ["everyone", "free-user"]
    assert names(snapshot.rules_for("free", "api:search")) == \
        ["any-search", "everyone", "free-search", "free-user"]
    assert names(snapshot.rules_for("pro", "api:search")) == ["any-search", "everyone", "pro-user"]
    assert names(snapshot.rules_for(None, "")) == ["everyone"]
    assert names(snapshot.rules_for("unknown-plan", "api:items")) == ["everyone"]


def test_rules_for_is_memoised_per_plan_and_endpoint_but_bounded():
    rule = make_rule(plan="free")
    snapshot = Snapshot(version="1", rules=(rule,))
    assert snapshot.rules_for("free", "a") is snapshot.rules_for("free", "a")
    for i in range(10_050):
        snapshot.rules_for("free", f"endpoint-{i}")
    assert len(snapshot._rules_for) == 10_000
    assert snapshot.rules_for("free", "endpoint-10049") == (rule,)  # still correct uncached


def test_disabled_rules_are_ignored():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("on", free, scope=Scope.IP, burst=1)
    add_rule("off", free, scope=Scope.IP, burst=1, rate=1, enabled=False)
    snapshot = limiter().snapshot()
    assert names(snapshot.rules_for("free", "api:items")) == ["on"]
    decision = decide(request_from(), AnonymousUser(), "api:items", now_ms=T0)
    assert [p.name for p in decision.policies] == ["on"]


def test_compiled_rule_carries_mode_and_failure_mode():
    add_rule("shadowed", mode=Mode.SHADOW, on_redis_failure=FailureMode.CLOSED)
    add_rule("default-failure", on_redis_failure=FailureMode.DEFAULT)
    add_rule("opens", on_redis_failure=FailureMode.OPEN)
    by_name = {r.name: r for r in limiter().snapshot().rules}
    assert by_name["shadowed"].shadow and by_name["shadowed"].fail_open is False
    assert not by_name["default-failure"].shadow and by_name["default-failure"].fail_open is None
    assert by_name["opens"].fail_open is True


def test_the_compile_reads_tuples_and_builds_no_model_instance():
    """A reload reads every configuration row: as model instances that took three times the
    CPU (33 ms against 11 ms for the bench's rows), each edit stalling requests for longer.
    The snapshot still carries every field, through the joins included (a rule's plan, a key's
    plan, a cost's plan) and the dates (an assignment not yet started is left out)."""
    from datetime import datetime, timedelta, timezone

    from django.db.models.signals import post_init

    from ratelimit_app.config import compiler
    from ratelimit_app.models import ApiKey, hash_api_key

    pro = add_plan("pro", default_for_authenticated=True)
    rule = add_rule("pro-user", pro, mode=Mode.SHADOW, on_redis_failure=FailureMode.OPEN,
                    alert_thresholds="50,90")
    user, later = add_user("ann", pro), add_user("bob")
    now = datetime(2027, 1, 1, tzinfo=timezone.utc)
    PlanAssignment.objects.create(user=later, plan=pro, starts_at=now + timedelta(days=1))
    key, _ = ApiKey.create_key(user, "ci", raw_key="rk_test_compile", plan=pro, tenant="acme")
    IdentityOverride.objects.create(user=user, rule=rule, rate=5, period_s=10, burst=7)
    EndpointCost.objects.create(endpoint="api:search", plan=pro, cost=3)
    built = []

    def count(sender, **kwargs):
        built.append(sender.__name__)
    post_init.connect(count)
    try:
        snapshot = compiler.compile_snapshot("v", now.timestamp())
    finally:
        post_init.disconnect(count)

    assert built == []
    (compiled,) = snapshot.rules
    assert (compiled.plan, compiled.shadow, compiled.fail_open, compiled.alerts) == \
        ("pro", True, True, (50, 90))
    assert snapshot.default_authenticated_plan == "pro" and snapshot.plans == {"pro"}
    assert snapshot.assignments == {str(user.pk): ("pro", "")}
    assert snapshot.next_change_at == (now + timedelta(days=1)).timestamp()
    entry = snapshot.api_keys[hash_api_key("rk_test_compile")]
    assert (entry.id, entry.user_id, entry.plan, entry.tenant) == (key.pk, str(user.pk), "pro",
                                                                   "acme")
    assert snapshot.overrides[("user", str(user.pk))][0].rule_id == rule.pk
    assert snapshot.costs == {("api:search", "*", "pro"): 3}


# --- cost_for ----------------------------------------------------------------------------------

def test_cost_for_prefers_the_most_specific_row():
    pro = add_plan("pro")
    for method, plan, cost in [("GET", pro, 7), ("*", pro, 6), ("POST", None, 3), ("GET", None, 5),
                               ("*", None, 4)]:
        EndpointCost.objects.create(endpoint="api:search", method=method, plan=plan, cost=cost)
    snapshot = limiter().snapshot()

    assert snapshot.cost_for("api:search", "GET", "pro") == 7      # plan + method
    assert snapshot.cost_for("api:search", "POST", "pro") == 6     # plan + any beats method
    assert snapshot.cost_for("api:search", "GET", "free") == 5     # method
    assert snapshot.cost_for("api:search", "POST", None) == 3      # method
    assert snapshot.cost_for("api:search", "DELETE", "free") == 4  # any
    assert snapshot.cost_for("api:items", "GET", "pro") == 1       # no row: 1


def test_request_is_charged_its_endpoint_cost_except_on_endpoint_rules():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, burst=100)
    add_rule("search-calls", free, scope=Scope.IP, endpoint="api:search", burst=100)
    EndpointCost.objects.create(endpoint="api:search", method="GET", cost=5)
    decision = decide(request_from(), AnonymousUser(), "api:search", now_ms=T0)
    assert decision.cost == 5
    remaining = {p.name: p.remaining for p in decision.policies}
    assert remaining == {"free-ip": 95, "search-calls": 99}  # endpoint rules count calls


# --- overrides ---------------------------------------------------------------------------------

def test_exempt_override_skips_redis_entirely(redis_server):
    free = add_plan("free", default_for_authenticated=True)
    add_rule("free-user", free, burst=1)
    add_rule("everyone", scope=Scope.GLOBAL, burst=1)
    vip = add_user("vip", free)
    IdentityOverride.objects.create(user=vip, exempt=True)
    limiter().snapshot()  # warm (reads the config version once)

    calls_before = redis_server.command_calls("evalsha") + redis_server.command_calls("eval")
    keys_before = redis_server.client().dbsize()
    decisions = [decide(request_from(), vip, "api:items") for _ in range(5)]
    assert all(d.allowed and d.exempt and not d.policies for d in decisions)
    assert redis_server.command_calls("evalsha") + redis_server.command_calls("eval") == calls_before
    assert redis_server.client().dbsize() == keys_before


def test_override_numbers_replace_user_and_ip_rule_numbers_only():
    free = add_plan("free", default_for_authenticated=True)
    add_rule("free-user", free, rate=10, period_s=60, burst=10)
    add_rule("free-ip", free, scope=Scope.IP, rate=10, period_s=60, burst=10)
    add_rule("free-plan", free, scope=Scope.PLAN, rate=10, period_s=60, burst=10)
    special = add_user("special", free)
    IdentityOverride.objects.create(user=special, rate=2, period_s=30, burst=3)
    plain = add_user("plain", free)

    decision = decide(request_from("198.51.100.1"), special, "api:items", now_ms=T0)
    numbers = {p.name: (p.quota, p.window_s, p.burst, p.remaining) for p in decision.policies}
    assert numbers == {"free-plan": (10, 60, 10, 9), "free-user": (2, 30, 3, 2),
                       "free-ip": (2, 30, 3, 2)}
    for expected in (True, True, False):  # the override's burst of 3 is what limits
        assert decide(request_from("198.51.100.1"), special, "api:items",
                             now_ms=T0).allowed is expected
    # another user on the same plan keeps the rule's own numbers
    other = decide(request_from("198.51.100.2"), plain, "api:items", now_ms=T0)
    assert {p.name: p.burst for p in other.policies} == {"free-plan": 10, "free-user": 10,
                                                         "free-ip": 10}


def test_override_of_one_rule_leaves_the_callers_other_rules_alone():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, rate=10, period_s=60, burst=10)
    narrow = add_rule("free-ip-search", free, scope=Scope.IP, rate=10, period_s=60, burst=10)
    IdentityOverride.objects.create(ip="198.51.100.9", rule=narrow, rate=1, period_s=60, burst=50)
    decision = decide(request_from("198.51.100.9"), AnonymousUser(), "api:items",
                             now_ms=T0)
    assert {p.name: p.burst for p in decision.policies} == {"free-ip": 10, "free-ip-search": 50}


# --- shadow ------------------------------------------------------------------------------------

def test_shadow_rule_reports_would_be_denials_and_never_denies():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, rate=1, period_s=60, burst=100)
    add_rule("trial", free, scope=Scope.IP, rate=1, period_s=60, burst=2, mode=Mode.SHADOW)
    decisions = [decide(request_from(), AnonymousUser(), "api:items", now_ms=T0)
                 for _ in range(4)]
    assert all(d.allowed for d in decisions)
    assert [d.shadow_violations for d in decisions] == [(), (), ("trial",), ("trial",)]
    assert all(d.violated == () for d in decisions)
    assert decisions[-1].retry_after_s == 0


def test_shadow_rule_does_not_report_when_an_enforced_rule_denies_for_its_own_reasons():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("strict", free, scope=Scope.IP, rate=1, period_s=60, burst=1)
    add_rule("trial", free, scope=Scope.IP, rate=1, period_s=60, burst=5, mode=Mode.SHADOW)
    decide(request_from(), AnonymousUser(), "api:items", now_ms=T0)
    denied = decide(request_from(), AnonymousUser(), "api:items", now_ms=T0)
    assert not denied.allowed
    assert denied.violated == ("strict",)
    assert denied.shadow_violations == ()


# --- reloading and failures ---------------------------------------------------------------------

def test_snapshot_is_reused_until_the_config_version_changes(django_assert_num_queries):
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, burst=5)
    first = limiter().snapshot()
    with django_assert_num_queries(0):
        assert limiter().snapshot() is first
    limiter().bump_config_version()
    limiter().policies.observe_version(limiter().read_version())  # as a Lua reply would report it
    second = limiter().snapshot()
    assert second is not first
    assert second.version == limiter().read_version() != first.version


def test_version_is_polled_once_the_check_interval_has_passed(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_CHECK_INTERVAL_S": 0}
    add_rule("old", scope=Scope.GLOBAL)
    first = limiter().snapshot()
    Rule.objects.create(name="new", scope=Scope.GLOBAL, rate=1, period_s=1, burst=1)
    limiter().bump_config_version()  # what the on_commit hook does after a real commit
    assert names(limiter().snapshot().rules) == ["new", "old"]
    assert limiter().snapshot() is not first


def test_snapshot_survives_a_database_error_and_keeps_enforcing():
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, rate=1, period_s=60, burst=2)
    good = limiter().snapshot()
    with connection.cursor() as cursor:  # a real DB error; rolled back with the test
        cursor.execute(f"ALTER TABLE {Rule._meta.db_table} RENAME TO broken_rules")
    limiter().bump_config_version()
    limiter().policies.observe_version(limiter().read_version())

    assert limiter().snapshot() is good  # the old rules stay in force
    results = [decide(request_from(), AnonymousUser(), "api:items", now_ms=T0).allowed
               for _ in range(3)]
    assert results == [True, True, False]


def test_first_load_during_a_database_error_serves_an_empty_policy():
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {Rule._meta.db_table} RENAME TO broken_rules")
    snapshot = limiter().snapshot()
    assert snapshot.rules == () and snapshot.version == "unknown"
    decision = decide(request_from(), AnonymousUser(), "api:items")
    assert decision.allowed and not decision.policies


def test_database_outage_is_retried_once_per_check_interval_not_per_request(caplog):
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, rate=1, period_s=60, burst=100)
    limiter().snapshot()
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {Rule._meta.db_table} RENAME TO broken_rules")
    limiter().bump_config_version()  # a change this worker cannot load while the DB is down

    for _ in range(5):  # every Lua reply reports the version the worker could not load
        assert decide(request_from(), AnonymousUser(), "api:items").allowed
    failures = [r for r in caplog.records if "could not load" in r.getMessage()]
    assert len(failures) == 1


def test_configuration_reloads_once_the_database_is_back(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_CHECK_INTERVAL_S": 0}
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP, rate=1, period_s=60, burst=100)
    limiter().snapshot()
    table = Rule._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO broken_rules")
    limiter().bump_config_version()  # a change this worker cannot load yet
    assert limiter().snapshot().version != limiter().read_version()  # still the old one
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE broken_rules RENAME TO {table}")
    reloaded = limiter().snapshot()
    assert reloaded.version == limiter().read_version()
    assert names(reloaded.rules) == ["free-ip"]


@pytest.mark.parametrize("override_ip, client", [
    ("198.51.100.9", "198.51.100.9"),
    ("2001:db8::1", "2001:db8::1"),
    ("2001:db8::1", "2001:db8::ffff"),  # IPv6 clients are limited per /64: so are overrides
    ("2001:db8::1", "::ffff:192.0.2.1"),  # and an unrelated IPv4-mapped client is not exempt
])
def test_ip_override_matches_the_address_as_the_identity_sees_it(override_ip, client):
    free = add_plan("free", default_for_anonymous=True)
    add_rule("free-ip", free, scope=Scope.IP)
    IdentityOverride.objects.create(ip=override_ip, exempt=True)
    decision = decide(request_from(client), AnonymousUser(), "api:items", now_ms=T0)
    assert decision.exempt is (client != "::ffff:192.0.2.1")


def test_a_callers_bucket_plan_is_memoised_per_snapshot_and_the_memo_is_bounded(monkeypatch):
    import dataclasses

    from ratelimit_app.decision import engine
    from ratelimit_app.decision.identity import Identity

    snapshot = Snapshot(version="1", rules=(make_rule(scope="ip"), make_rule(scope="global")))
    caller = Identity(kind="anonymous", display="203.0.113.7", ip="203.0.113.7", plan=None)
    first = engine.plan_buckets(snapshot, caller, "", 1)
    assert [b.rule.scope for b in first] == ["global", "ip"]
    assert engine.plan_buckets(snapshot, caller, "", 1) is first      # served from the memo
    assert engine.plan_buckets(snapshot, caller, "", 2) is not first  # another cost, other plan

    monkeypatch.setattr(engine, "MAX_PLANS_MEMOISED", 3)
    for i in range(10):  # one-off callers never hold more than the bound
        engine.plan_buckets(snapshot, caller._replace(ip=f"198.51.100.{i}"), "", 1)
        assert len(snapshot.buckets_memo) <= 3

    # a new snapshot (new rules) starts with an empty memo, even when copied from the old one
    assert dataclasses.replace(snapshot, version="2").buckets_memo == {}


def test_a_planned_call_is_what_take_args_builds_for_a_debit_on_the_redis_clock():
    from ratelimit_app.decision import engine
    from ratelimit_app.decision.identity import Identity

    rules = (make_rule(scope="global"), make_rule(scope="ip"), make_rule(scope="ip", rate=5))
    caller = Identity(kind="anonymous", display="203.0.113.7", ip="203.0.113.7", plan=None)
    planned = engine.plan_buckets(Snapshot(version="1", rules=rules), caller, "", 3)
    assert planned == tuple(planned) and len(planned) == 3  # still the tuple of buckets
    assert planned.keys == tuple(b.key for b in planned)
    assert planned.keys[1] == planned.keys[2]  # one identity's buckets share its key
    # fenced on the snapshot's version: a debit on superseded rules debits nothing
    assert list(planned.debit_args) == engine.take_args(planned, fence="1")
    assert planned.debit_args[1] == b"11" and engine.take_args(planned)[1] == b"1"

    # a calendar quota's argument depends on the moment: no planned call, take_args builds it
    with_quota = rules + (make_rule(scope="ip", rate=1000, calendar="day"),)
    planned = engine.plan_buckets(Snapshot(version="1", rules=with_quota), caller, "", 1)
    assert planned.debit_args is None
