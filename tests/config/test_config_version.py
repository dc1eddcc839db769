"""D1: the config version survives loss and regression of its Redis key.

Workers reload whenever the version in Redis differs from the one their snapshot was built at,
and a bump always writes a value never used before, so an edit is never hidden behind a version
a worker already holds: not after FLUSHALL, not after the key went back to an older value (a
failover to a replica that missed the last bump, a restore).
"""

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

from ratelimit_app.decision import keys
from ratelimit_app.models import Plan, Rule, Scope
from ratelimit_app.runtime import signals

from ..helpers import decide, limiter

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000_000
VERSION_KEY = keys.config_version_key("rl")


@pytest.fixture(autouse=True)
def no_polling(settings):
    # only Lua replies bring news of a version here, as on a busy worker
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_CHECK_INTERVAL_S": 3600}


def ip_request():
    return RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.7")


def policy_names():
    """Decide twice (the first reply may only announce a new version) and return the names of
    the policies the worker enforced on the second."""
    decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
    return [p.name for p in decide(ip_request(), AnonymousUser(), "hello",
                                          now_ms=T0).policies]


def add_rule_elsewhere(name, plan):
    """Save a rule as another process would: the row and the version bump, but this worker's
    snapshot is not reset (only the saving process reloads at once)."""
    Rule.objects.bulk_create([Rule(name=name, plan=plan, scope=Scope.IP, endpoint="hello",
                                   rate=1, period_s=60, burst=5)])  # bulk: no signal
    limiter().bump_config_version()


@pytest.fixture
def worker_with_one_rule():
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="free-ip", plan=plan, scope=Scope.IP, rate=1, period_s=60, burst=5)
    signals.bump_config_version()
    assert policy_names() == ["free-ip"]
    return plan


def test_every_bump_is_a_value_never_used_before(redis_client):
    seen = {limiter().bump_config_version() for _ in range(200)}
    assert len(seen) == 200
    assert limiter().read_version() in seen


def test_an_edit_after_flushall_reaches_the_worker(worker_with_one_rule, redis_client):
    redis_client.flushall()  # the version key is gone with everything else
    add_rule_elsewhere("new-rule", worker_with_one_rule)
    assert policy_names() == ["free-ip", "new-rule"]


def test_a_missing_version_alone_makes_the_worker_reload(worker_with_one_rule, redis_client):
    held = limiter().snapshot().version
    redis_client.delete(VERSION_KEY)
    decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)  # reply: "0"
    assert limiter().snapshot().version == "0" != held


def test_an_edit_after_the_version_went_back_reaches_the_worker(worker_with_one_rule,
                                                                redis_client):
    older = limiter().read_version()
    limiter().bump_config_version()
    assert policy_names() == ["free-ip"]  # the worker now holds the newer version
    # a failover to a replica that missed the last bump: the key holds the older value
    redis_client.set(VERSION_KEY, older)
    add_rule_elsewhere("new-rule", worker_with_one_rule)
    assert policy_names() == ["free-ip", "new-rule"]


def test_a_worker_reloads_when_the_version_goes_back_even_without_an_edit(worker_with_one_rule,
                                                                          redis_client):
    older = limiter().read_version()
    limiter().bump_config_version()
    policy_names()
    redis_client.set(VERSION_KEY, older)
    decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
    assert limiter().snapshot().version == older
