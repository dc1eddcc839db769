"""Overrides and plan assignments with a start and an end (models.Scheduled, policy.PolicyCache).

In process, with the Limiter's test clock (``FakeClock``: its wall time drives which dated rows
a snapshot holds and when it is next out of date). No row is saved between a start and an end:
the worker switches by itself, and no request in between queries the database.
"""

import datetime

import pytest
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext

from ratelimit_app.admin.dashboard.data import temporary_rows
from ratelimit_app.config import audit, quotas_as_code
from ratelimit_app.config.compiler import compile_snapshot
from ratelimit_app.decision.identity import identify
from ratelimit_app.models import (
    ApiKey,
    AuditEntry,
    IdentityOverride,
    Plan,
    PlanAssignment,
    Rule,
    Schedule,
    Scope,
)

from ..helpers import limiter, poll_until, use_fake_clock

pytestmark = pytest.mark.django_db

HUGE = 1_000_000


@pytest.fixture
def clock(settings):
    # the rows are compared with the snapshot once an hour: a switch seen here is the schedule's
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_RELOAD_INTERVAL_S": 3600}
    return use_fake_clock()


def at(clock, seconds):
    """The wall-clock datetime ``seconds`` after the test clock's now."""
    return datetime.datetime.fromtimestamp(clock.wall_time() + seconds, tz=datetime.timezone.utc)


@pytest.fixture
def rule(clock):
    free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    return Rule.objects.create(name="free-ip", plan=free, scope=Scope.IP, endpoint="hello",
                               rate=1, period_s=60, burst=HUGE)


def bursts():
    """Decide one request to `hello` from 192.0.2.7; return the burst of each policy."""
    request = RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.7")
    decision = limiter().decide(request, AnonymousUser(), "hello")
    return {policy.name: policy.burst for policy in decision.policies}


def walk(clock, until_s, step_ms=997):
    """Advance the clock in steps up to ``until_s`` seconds after its start, deciding a request
    at each; return the set of bursts seen."""
    seen = set()
    while clock.seconds() + step_ms / 1000 < until_s:
        clock.advance(step_ms)
        seen.add(bursts()["free-ip"])
    return seen


def test_an_override_applies_at_its_start_and_reverts_at_its_end_without_a_save(rule, clock):
    start = clock.seconds()
    # 90 s ahead: beyond the 60 s the worker trusts its monotonic clock, so it rechecks once
    IdentityOverride.objects.create(ip="192.0.2.7", rule=rule, rate=5, period_s=60, burst=7,
                                    starts_at=at(clock, 90), ends_at=at(clock, 200),
                                    reason="launch week")
    assert bursts() == {"free-ip": HUGE}
    with CaptureQueriesContext(connection) as captured:
        assert walk(clock, start + 90) == {HUGE}  # before the start, from memory
    assert captured.captured_queries == []

    clock.advance(round((start + 90 - clock.seconds()) * 1000))  # exactly the start
    with CaptureQueriesContext(connection) as captured:
        assert bursts() == {"free-ip": 7}
    assert captured.captured_queries  # this request recompiled the rules
    with CaptureQueriesContext(connection) as captured:
        assert walk(clock, start + 200) == {7}  # the override, from memory
    assert captured.captured_queries == []

    clock.advance(round((start + 200 - clock.seconds()) * 1000))  # the end
    assert bursts() == {"free-ip": HUGE}
    assert IdentityOverride.objects.get().schedule_at(at(clock, 0)) == Schedule.EXPIRED


def test_a_dated_override_wins_over_a_permanent_one_while_it_lasts(rule, clock):
    IdentityOverride.objects.create(ip="192.0.2.7", rule=rule, rate=1, period_s=60, burst=3,
                                    reason="permanent")
    IdentityOverride.objects.create(ip="192.0.2.7", rule=rule, rate=5, period_s=60, burst=15,
                                    ends_at=at(clock, 30), reason="5x until the demo ends")
    assert bursts() == {"free-ip": 15}
    clock.advance(30_000)
    assert bursts() == {"free-ip": 3}


def test_a_snapshot_holds_the_active_rows_and_the_next_moment_one_starts_or_ends(clock):
    pro = Plan.objects.create(slug="pro", name="Pro")
    user = User.objects.create(username="acme")
    now = clock.wall_time()
    PlanAssignment.objects.create(user=user, plan=pro, tenant="acme",
                                  starts_at=at(clock, 10), ends_at=at(clock, 20))
    before = compile_snapshot("v", now=now)
    assert before.assignments == {} and before.next_change_at == pytest.approx(now + 10)
    during = compile_snapshot("v", now=now + 10)
    assert during.assignments == {str(user.pk): ("pro", "acme")}
    assert during.next_change_at == pytest.approx(now + 20)
    after = compile_snapshot("v", now=now + 20)
    assert after.assignments == {} and after.next_change_at == float("inf")


def test_the_end_must_come_after_the_start(clock):
    override = IdentityOverride(ip="192.0.2.7", exempt=True, starts_at=at(clock, 60),
                                ends_at=at(clock, 60))
    with pytest.raises(ValidationError) as error:
        override.full_clean()
    assert error.value.message_dict == {
        "ends_at": ["The end must be after the start: set a later end, or clear one of the two."]}
    assignment = PlanAssignment(starts_at=at(clock, 60), ends_at=at(clock, 10))
    with pytest.raises(ValidationError) as error:
        assignment.clean()
    assert "ends_at" in error.value.message_dict


def test_a_permanent_and_a_dated_override_of_one_caller_export_and_import_unchanged(rule, clock):
    IdentityOverride.objects.create(ip="192.0.2.7", rule=rule, exempt=True)
    IdentityOverride.objects.create(ip="192.0.2.7", rule=rule, exempt=True,
                                    starts_at=at(clock, 10), ends_at=at(clock, 20),
                                    reason="maintenance")
    document = quotas_as_code.export_document()
    dated = document["identity_overrides"][1]
    assert dated["reason"] == "maintenance" and dated["starts_at"] and dated["ends_at"]
    assert quotas_as_code.plan_import(document).changes == []


def test_a_wall_clock_stepped_forward_is_caught_within_a_minute():
    """The switch moment is kept on the monotonic clock, but the wall clock is read again at
    least every SCHEDULE_RECHECK_S: a clock stepped past the moment switches by then."""
    from ratelimit_app.config.policy import SCHEDULE_RECHECK_S, PolicyCache
    from ratelimit_app.config.snapshot import Snapshot

    monotonic, wall, loads = [0.0], [1_000.0], []

    def load(version):
        loads.append(wall[0])
        return Snapshot(version, next_change_at=wall[0] + 3600)  # a row starts in an hour

    cache = PolicyCache(lambda: "v1", check_interval_s=3600, clock=lambda: monotonic[0],
                        load=load, wall_clock=lambda: wall[0])
    first = cache.get()
    wall[0] += 7200  # NTP steps the wall clock two hours ahead; the monotonic clock does not
    monotonic[0] = SCHEDULE_RECHECK_S - 1
    assert cache.get() is first and len(loads) == 1  # not rechecked yet: no wall-clock read
    monotonic[0] = SCHEDULE_RECHECK_S
    assert cache.get() is not first and len(loads) == 2


def test_the_watcher_compiles_a_moments_rules_ahead_and_the_first_request_after_swaps_them():
    """Dated rows switch at their moment on idle and busy workers alike: the snapshot of the
    moment is compiled ahead by the watcher, and taken by the first request at or after the
    moment (or by the watcher), with no compile on the request's thread."""
    import threading

    from ratelimit_app.config.policy import UPCOMING_LEAD_S, PolicyCache

    from ratelimit_app.config.snapshot import Snapshot

    monotonic, wall, compiled_in = [0.0], [1_000.0], []
    moment = 1_010.0  # a row starts 10 s after the first compile

    def load(version, at=None):
        compiled_in.append(threading.current_thread().name)
        at = wall[0] if at is None else at
        return Snapshot(version, compiled_at=at,
                        next_change_at=moment if at < moment else moment + 3600,
                        plans=frozenset({"after"} if at >= moment else {"before"}))

    cache = PolicyCache(lambda: "v1", check_interval_s=3600, clock=lambda: monotonic[0],
                        load=load, wall_clock=lambda: wall[0], in_threads=True)
    try:
        first = cache.get()
        assert first.plans == {"before"} and cache.upcoming is None  # the moment is far
        wall[0], monotonic[0] = moment - UPCOMING_LEAD_S / 2, 10 - UPCOMING_LEAD_S / 2
        poll_until(lambda: cache.upcoming is not None, timeout_s=10,
                   what="the watcher to compile the moment's rules ahead")
        assert compiled_in == ["MainThread", "ratelimit-config-watcher"]
        assert cache.get() is first  # not yet
        wall[0], monotonic[0] = moment, 10.0
        switched = cache.get()
        assert switched.plans == {"after"} and switched.version == "v1"
        assert compiled_in == ["MainThread", "ratelimit-config-watcher"]  # swapped, not compiled
    finally:
        cache.close()


def test_a_moment_whose_rules_are_not_ready_is_compiled_by_the_request():
    from ratelimit_app.config.policy import PolicyCache
    from ratelimit_app.config.snapshot import Snapshot

    monotonic, wall, loads = [0.0], [1_000.0], []

    def load(version, at=None):
        loads.append(at)
        return Snapshot(version, next_change_at=1_005.0 if wall[0] < 1_005.0 else 9e9,
                        plans=frozenset({"after"} if wall[0] >= 1_005.0 else {"before"}))

    cache = PolicyCache(lambda: "v1", check_interval_s=3600, clock=lambda: monotonic[0],
                        load=load, wall_clock=lambda: wall[0])  # no watcher: nothing ahead
    assert cache.get().plans == {"before"}
    wall[0], monotonic[0] = 1_005.0, 5.0
    assert cache.get().plans == {"after"} and len(loads) == 2


# --- the plan of an API key, with a start and an end -------------------------------------------

@pytest.fixture
def dated_key(clock):
    """A key of a user on "team" (permanently), its own plan "pro" from 90 s to 200 s from now."""
    Plan.objects.create(slug="free", name="Free", default_for_authenticated=True)
    team, pro = Plan.objects.create(slug="team", name="Team"), Plan.objects.create(slug="pro",
                                                                                   name="Pro")
    user = User.objects.create(username="acme")
    PlanAssignment.objects.create(user=user, plan=team)
    key, _ = ApiKey.create_key(user, "ci", raw_key="rk_acme_ci", plan=pro,
                               starts_at=at(clock, 90), ends_at=at(clock, 200),
                               reason="trial of pro")
    return key


def key_plan():
    """Return the plan a request with the key rk_acme_ci is on, as the current snapshot says."""
    request = RequestFactory().get("/hello/", HTTP_X_API_KEY="rk_acme_ci")
    return identify(request, None, limiter().snapshot()).plan


def test_a_keys_plan_applies_between_its_dates_and_its_users_plan_outside(dated_key, clock):
    start = clock.seconds()
    assert key_plan() == "team"  # before the start: the plan of the key's user
    with CaptureQueriesContext(connection) as captured:
        clock.advance(60_000)
        assert key_plan() == "team"
        clock.advance(round((start + 90 - clock.seconds()) * 1000) - 1)
        assert key_plan() == "team"  # a millisecond before the start, from memory
    assert captured.captured_queries == []

    clock.advance(1)  # the start
    assert key_plan() == "pro"
    with CaptureQueriesContext(connection) as captured:
        clock.advance(100_000)
        assert key_plan() == "pro"  # from memory until the end
    assert captured.captured_queries == []

    clock.advance(round((start + 200 - clock.seconds()) * 1000))  # the end
    assert key_plan() == "team"
    assert ApiKey.objects.get().schedule_at(at(clock, 0)) == Schedule.EXPIRED


def test_the_dashboards_inspector_shows_a_key_on_the_plan_requests_see(dated_key, clock):
    from ratelimit_app.admin.dashboard.inspector import find_identity

    def inspected_plan():
        return find_identity(f"key:{dated_key.pk}", limiter().snapshot()).identity.plan

    assert inspected_plan() == "team"
    clock.advance(90_000)
    assert inspected_plan() == "pro"


def test_a_key_outside_its_plans_dates_is_on_the_default_plan_without_a_user_plan(dated_key,
                                                                                  clock):
    PlanAssignment.objects.all().delete()
    assert key_plan() == "free"
    clock.advance(90_000)
    assert key_plan() == "pro"


def test_dates_of_a_keys_plan_need_a_plan_and_an_end_after_the_start(dated_key, clock):
    dated_key.plan = None
    with pytest.raises(ValidationError) as error:
        dated_key.full_clean()
    assert error.value.message_dict == {"plan": [
        "The start and the end are those of the key's plan: choose a plan, or clear them."]}
    dated_key.plan, dated_key.ends_at = Plan.objects.get(slug="pro"), dated_key.starts_at
    with pytest.raises(ValidationError) as error:
        dated_key.full_clean()
    assert "ends_at" in error.value.message_dict


def test_the_dashboard_lists_a_key_while_its_dated_plan_applies(dated_key, clock):
    assert temporary_rows(at(clock, 0)) == []
    rows = temporary_rows(at(clock, 90))
    assert [(row["kind"], row["what"], row["reason"]) for row in rows] == [
        ("key-plan", "plan Pro", "trial of pro")]
    assert rows[0]["identity"] == "key rk_acme_… (ci) of acme"
    assert rows[0]["ends_at"] == dated_key.ends_at.timestamp()
    dated_key.active = False
    dated_key.save()
    assert temporary_rows(at(clock, 90)) == []  # a revoked key is on no plan


@pytest.mark.django_db(transaction=True)  # real commits: each save is recorded at its commit
def test_the_audit_trail_records_the_dates_of_a_keys_plan(dated_key, clock):
    entry = AuditEntry.objects.order_by("-id").first()
    item = next(item for item in audit.document_of(entry)[audit.API_KEYS]
                if item["prefix"] == "rk_acme_")
    assert item["plan"] == "pro" and item["reason"] == "trial of pro"
    assert item["starts_at"] == str(dated_key.starts_at)

    dated_key.ends_at = at(clock, 300)
    dated_key.reason = "trial extended"
    dated_key.save()
    change = AuditEntry.objects.order_by("-id").first()
    assert change.summary == (
        f"API key (prefix rk_acme_, user acme, name ci): ends_at "
        f"\"{at(clock, 200)}\" → \"{at(clock, 300)}\"; reason \"trial of pro\" → "
        f"\"trial extended\"")


def test_an_entry_recorded_before_keys_had_dates_shows_no_change_of_an_undated_key(clock):
    user = User.objects.create(username="acme")
    ApiKey.create_key(user, "ci", raw_key="rk_acme_ci")
    now = audit.audit_document()
    before = {**now, audit.API_KEYS: [
        {name: value for name, value in item.items()
         if name not in ("starts_at", "ends_at", "reason")} for item in now[audit.API_KEYS]]}
    assert audit.diff_documents(before, now) == []


def test_an_import_leaves_the_plans_and_dates_of_api_keys_alone(dated_key, clock):
    """API keys are not in the quotas-as-code document (they are credentials): an export and
    its import neither carry nor clear a key's plan and its dates."""
    document = quotas_as_code.export_document()
    assert "rk_acme_" not in quotas_as_code.dumps(document)
    quotas_as_code.apply_import(quotas_as_code.plan_import(document).changes)
    key = ApiKey.objects.get()
    assert (key.plan.slug, key.starts_at, key.reason) == ("pro", at(clock, 90), "trial of pro")


def keys_with_dated_plans():
    """Keys of one user whose own plan is active, scheduled, expired and permanent (now)."""
    from django.utils import timezone

    pro, _ = Plan.objects.get_or_create(slug="pro", defaults={"name": "Pro"})
    user, _ = User.objects.get_or_create(username="acme")
    now, day = timezone.now(), datetime.timedelta(days=1)
    for name, starts_at, ends_at in (("active", now - day, now + day),
                                     ("scheduled", now + day, None),
                                     ("expired", now - 2 * day, now - day),
                                     ("permanent", None, None)):
        ApiKey.create_key(user, name, raw_key=f"rk_{name[:5]}_key", plan=pro,
                          starts_at=starts_at, ends_at=ends_at, reason=f"{name} trial")


def listed_schedules(html):
    """Return {key name: schedule state} of the API key list's rows in ``html``."""
    import re

    return dict(re.findall(r'<td class="field-name_cell"><a [^>]*>([^<]+)</a></td>'
                           r'.*?data-schedule="(\w+)"', html))


def test_the_admin_lists_and_filters_keys_by_the_schedule_of_their_plan(admin_client):
    from django.urls import reverse

    keys_with_dated_plans()
    url = reverse("admin:ratelimit_callers_apikey_changelist")
    html = admin_client.get(url).content.decode()
    assert listed_schedules(html) == {"active": "active", "scheduled": "scheduled",
                                      "expired": "expired", "permanent": "permanent"}
    assert "active trial" in html
    for state in ("active", "scheduled", "expired", "permanent"):
        html = admin_client.get(url, {"schedule": state}).content.decode()
        assert listed_schedules(html) == {state: state}


def test_the_admin_saves_the_dates_of_a_keys_plan_and_refuses_dates_without_a_plan(
        admin_client):
    from django.urls import reverse

    keys_with_dated_plans()
    key = ApiKey.objects.get(name="permanent")
    url = reverse("admin:ratelimit_callers_apikey_change", args=[key.pk])
    form = {"user": key.user_id, "name": key.name, "plan": key.plan_id, "tenant": "",
            "active": "on", "starts_at_0": "", "starts_at_1": "",
            "ends_at_0": "2030-01-31", "ends_at_1": "18:00:00", "reason": "until January"}
    assert admin_client.post(url, form).status_code == 302
    key.refresh_from_db()
    assert (key.ends_at.year, key.reason) == (2030, "until January")

    response = admin_client.post(url, {**form, "plan": ""})
    assert response.status_code == 200
    assert "The start and the end are those of the key&#x27;s plan" in response.content.decode()
