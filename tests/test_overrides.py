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

from ratelimit_app import quotas_as_code
from ratelimit_app.models import IdentityOverride, Plan, PlanAssignment, Rule, Schedule, Scope
from ratelimit_app.policy import compile_snapshot

from .helpers import limiter, use_fake_clock

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
                                    note="permanent")
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
    from ratelimit_app.policy import SCHEDULE_RECHECK_S, PolicyCache, Snapshot

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
