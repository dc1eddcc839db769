"""An edit's record of changes precedes its version by CONFIG_PUBLISH_LEAD_S: a worker's watcher
compiles the new rules in that lead, and the reload that finds the version key at them installs
them without compiling. Until then every decision stays on the rules in force, fenced on the
version key alone.
"""

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.checks import run_checks
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ratelimit_app.conf import get_config
from ratelimit_app.config.compiler import compile_snapshot
from ratelimit_app.config.versions import ConfigVersions
from ratelimit_app.models import Rule
from ratelimit_app.stores.base import CHANGE_LOG_LENGTH

from ..helpers import limiter
from .test_incremental_compile import CHANGES_KEY, NOW, T0, compared, ip_request, worker
from .test_row_compile import config_queries, rows  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db


def publisher(during_lead, lead_s=0.1):
    """The config versions of the test's Limiter with a lead of ``lead_s``, whose wait runs
    ``during_lead()`` instead of sleeping (the other worker's watcher, in the lead)."""
    seen = []

    def lead(seconds):
        seen.append(seconds)
        during_lead()

    store = limiter().store
    return ConfigVersions(store, get_config()["KEY_PREFIX"], limiter()._guarded, lead_s=lead_s,
                          sleep=lead), seen


@pytest.fixture
def other(rows):  # noqa: F811 (the fixture imported above)
    """Another worker of the deployment, holding the rules of a published version."""
    limiter().bump_config_version()
    another = worker()
    another.snapshot()
    yield another
    another.close()


def burst_of(decision, name):
    return {policy.name: policy.burst for policy in decision.policies}[name]


def test_the_record_comes_a_lead_before_the_version(redis_client):
    versions = None
    before = limiter().bump_config_version()
    during = []

    def look():
        during.append((versions.read(), versions.newest_recorded()))

    versions, leads = publisher(look)
    published = versions.publish({"rule:1"})
    assert leads == [0.1]
    # in the lead: the record names the new version, the version key still holds the old one
    assert during == [(before, published)]
    assert versions.read() == published == versions.newest_recorded()
    assert redis_client.lindex(CHANGES_KEY, 0).decode() == f"{published} rule:1"


def test_no_lead_when_no_row_changed_or_none_is_asked():
    versions, leads = publisher(lambda: None)
    versions.publish(())                  # a bucket reset: nothing to compile
    versions.publish({"rule"}, lead=False)  # an outside change, announced by a worker
    assert leads == []
    versions.publish(None)                # unknown: everything is compiled, ahead too
    assert leads == [0.1]


def test_a_worker_compiles_the_rules_in_the_lead_and_installs_them_when_published(other):
    held = other.snapshot()
    rule = Rule.objects.get(name="r0")
    in_lead = []

    def watcher_round():
        # what the other worker's watcher does in its next round: the record is ahead
        other.policies._prepare_published(held)
        prepared = other.policies.prepared
        # decisions meanwhile: the rules in force, debited (the version key is theirs)
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        in_lead.append((prepared.snapshot.version, burst_of(decision, "r0"),
                        other.snapshot() is held))

    versions, _ = publisher(watcher_round)
    Rule.objects.filter(pk=rule.pk).update(burst=77)
    published = versions.publish({f"rule:{rule.pk}"})
    assert in_lead == [(published, 10, True)]

    # the first request after the publication: fenced, it finds the rules compiled
    with CaptureQueriesContext(connection) as captured:
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
    assert config_queries(captured) == []
    assert other.policies.prepared_installs == 1 and other.policies.prepared is None
    assert burst_of(decision, "r0") == 77 and other.snapshot().version == published
    assert compared(other.snapshot()) == compared(compile_snapshot("x", NOW))


def test_a_publication_that_names_no_rows_is_compiled_whole_in_the_lead(other):
    held = other.snapshot()
    versions, _ = publisher(lambda: other.policies._prepare_published(held))
    Rule.objects.filter(name="r3").update(burst=66)
    published = versions.publish(None)  # what `ratelimit reload` publishes: unknown rows
    with CaptureQueriesContext(connection) as captured:
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
    assert config_queries(captured) == [] and other.policies.prepared_installs == 1
    assert other.policies.last_compile == "everything"
    assert burst_of(decision, "r3") == 66 and other.snapshot().version == published


def test_rules_prepared_on_an_older_snapshot_or_with_other_changes_noted_are_compiled(other):
    held = other.snapshot()
    rule = Rule.objects.get(name="r1")

    def prepare_then_note_another_change():
        other.policies._prepare_published(held)
        assert other.policies.prepared is not None
        # this process saw another table change meanwhile (its own edit, a comparison)
        other.policies.invalidate({"endpointcost"})

    versions, _ = publisher(prepare_then_note_another_change)
    Rule.objects.filter(pk=rule.pk).update(burst=55)
    versions.publish({f"rule:{rule.pk}"})
    decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
    assert other.policies.prepared_installs == 0  # compiled, reading both
    assert other.policies.last_compile == ["endpointcost", f"rule:{rule.pk}"]
    assert burst_of(decision, "r1") == 55


@pytest.mark.usefixtures("rows")
def test_a_worker_compiled_before_any_version_reads_only_what_was_published_since():
    other = worker()  # Redis is empty: its rules are version "0"
    try:
        assert other.snapshot().version == "0"
        rule = Rule.objects.get(name="r2")
        Rule.objects.filter(pk=rule.pk).update(burst=99)
        limiter().bump_config_version({f"rule:{rule.pk}"})
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert other.policies.last_compile == [f"rule:{rule.pk}"]  # not "everything"
        assert burst_of(decision, "r2") == 99
    finally:
        other.close()


def test_version_0_is_followed_only_while_the_record_was_never_trimmed(redis_client):
    versions = limiter().versions
    newest = None
    for i in range(CHANGE_LOG_LENGTH - 1):
        newest = versions.publish({f"rule:{i}"})
    assert versions.changes_since("0", newest) == \
        {f"rule:{i}" for i in range(CHANGE_LOG_LENGTH - 1)}
    newest = versions.publish({"apikey:1"})  # the record is full: older entries may be gone
    assert versions.changes_since("0", newest) is None


@pytest.mark.parametrize("value", ["0.1", True, -0.1, 2, float("nan")])
def test_an_invalid_lead_is_reported_and_the_default_applies(settings, value):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_PUBLISH_LEAD_S": value}
    errors = [e for e in run_checks() if e.id == "ratelimit_app.E012"]
    assert len(errors) == 1 and repr(value) in errors[0].msg
    assert limiter().versions.lead_s == 0.1


@pytest.mark.parametrize("value", [0, 0.1, 1])
def test_a_valid_lead_passes_the_check(settings, value):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_PUBLISH_LEAD_S": value}
    assert not [e for e in run_checks() if e.id == "ratelimit_app.E012"]
    assert limiter().versions.lead_s == value
