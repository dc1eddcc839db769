"""The fence: once a config version is published, no debit is made on rules older than it.

Each take.lua debit carries the version its rules were compiled from; the store refuses it (and
debits nothing) when it holds another, and the Limiter decides again on fresh rules. Here a
second Limiter of this process stands for another worker: it holds a snapshot, another
"process" edits the rows and publishes a version, and the worker's very next decision must be
made on the new rules, on a single node and on a Redis Cluster (where the version is copied
into every slot).
"""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory
from redis.crc import key_slot

from ratelimit_app.decision import engine, keys
from ratelimit_app.decision.buckets import read_state
from ratelimit_app.models import Plan, Rule, Scope
from ratelimit_app.runtime.limiter import Limiter
from ratelimit_app.stores import SupersededRules
from ratelimit_app.stores.cluster import SLOTS, slot_tags, version_copy_key

from ..helpers import FakeClock, limiter, make_bucket, make_rule

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000_000
VERSION_KEY = keys.config_version_key("rl")


@pytest.fixture(autouse=True)
def no_polling(settings):
    # news of a version only through the fence, as on a busy worker between two polls
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_CHECK_INTERVAL_S": 3600}


def ip_request(ip="192.0.2.7"):
    return RequestFactory().get("/hello/", REMOTE_ADDR=ip)


def worker():
    """Another worker of the same configuration, on the test clock, without threads."""
    return Limiter.from_settings(FakeClock(T0), metrics_autostart=False)


def publish_elsewhere():
    """Publish a new config version as another process's commit would."""
    return limiter().bump_config_version()


@pytest.fixture
def free_plan():
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="free-ip", plan=plan, scope=Scope.IP, rate=1, period_s=60,
                        burst=100)
    publish_elsewhere()
    return plan


# --- the script ------------------------------------------------------------------------------

def test_a_fenced_take_debits_only_when_the_store_holds_the_rules_version(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=5))
    store = limiter().store
    redis_client.set(VERSION_KEY, "v2")

    with pytest.raises(SupersededRules) as refused:
        store.take([bucket.key], engine.take_args([bucket], T0, fence="v1"),
                   version_key=VERSION_KEY)
    assert refused.value.version == "v2"
    assert redis_client.get(bucket.key) is None  # nothing debited, nothing written

    reply = store.take([bucket.key], engine.take_args([bucket], T0, fence="v2"),
                       version_key=VERSION_KEY)
    assert reply.allowed and reply.version == "v2"
    assert read_state(redis_client.get(bucket.key), bucket.rule.id)[0] == 4 * 60_000


def test_a_missing_version_key_fences_every_version_but_0(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=5))
    store = limiter().store
    with pytest.raises(SupersededRules) as refused:
        store.take([bucket.key], engine.take_args([bucket], T0, fence="v1"),
                   version_key=VERSION_KEY)
    assert refused.value.version == "0"  # a FLUSHALL: every worker reloads
    assert store.take([bucket.key], engine.take_args([bucket], T0, fence="0"),
                      version_key=VERSION_KEY).allowed


def test_a_look_is_never_fenced(redis_client):
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=5))
    redis_client.set(VERSION_KEY, "v2")
    reply = limiter().store.take([bucket.key],
                                 engine.take_args([bucket], T0, debit=False, fence="v1"),
                                 version_key=VERSION_KEY)
    assert reply.allowed and reply.version == "v2"


# --- the Limiter on one node ------------------------------------------------------------------

def test_the_first_decision_after_an_edit_is_made_on_the_new_rules(free_plan, redis_client):
    other = worker()
    try:
        assert [p.name for p in other.decide(ip_request(), AnonymousUser(), "hello",
                                             now_ms=T0).policies] == ["free-ip"]
        held = other.snapshot().version
        Rule.objects.filter(name="free-ip").update(burst=200)  # no signal...
        published = publish_elsewhere()                      # ... the version says it
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert other.snapshot().version == published != held
        assert decision.allowed and decision.policies[0].burst == 200  # the new rules decided
        # the refused attempt debited nothing: one debit per decision
        assert decision.policies[0].remaining == 98
    finally:
        other.close()


def test_a_deleted_rule_stops_counting_at_once(free_plan, redis_client):
    other = worker()
    try:
        other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        Rule.objects.filter(name="free-ip").delete()
        publish_elsewhere()  # what the delete's commit does
        assert not other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0).policies
    finally:
        other.close()


def test_rules_stay_in_force_unfenced_while_the_new_ones_cannot_be_compiled(free_plan,
                                                                               caplog):
    from django.db import connection

    other = worker()
    try:
        other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        with connection.cursor() as cursor:  # a real DB error; rolled back with the test
            cursor.execute(f"ALTER TABLE {Rule._meta.db_table} RENAME TO broken_rules")
        publish_elsewhere()
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        # the rules in memory decided (debited once), not the fail modes
        assert decision.allowed and not decision.degraded
        assert [p.name for p in decision.policies] == ["free-ip"]
        assert decision.policies[0].remaining == 98
    finally:
        other.close()


def test_the_event_loop_path_is_fenced_too(free_plan):
    other = worker()
    Rule.objects.filter(name="free-ip").update(burst=3)  # no signal

    async def edit_between_two_decisions():
        try:
            await other.adecide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
            published = await sync_to_async(publish_elsewhere)()
            return published, await other.adecide(ip_request(), AnonymousUser(), "hello",
                                                  now_ms=T0)
        finally:
            await other.async_store().aclose()

    other.snapshot()  # compiled before the edit is published (the burst then read: 3)
    Rule.objects.filter(name="free-ip").update(burst=4)
    try:
        published, decision = async_to_sync(edit_between_two_decisions)()
        assert decision.policies[0].burst == 4 and other.snapshot().version == published
    finally:
        other.close()


def test_exposed_version_names_the_rules_that_decided(free_plan, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EXPOSE_CONFIG_VERSION": True}
    other = worker()
    try:
        published = publish_elsewhere()
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert decision.config_version == published
    finally:
        other.close()


# --- on a Redis Cluster -------------------------------------------------------------------------

def test_every_slot_has_a_tag_of_its_own():
    tags = slot_tags()
    assert len(tags) == SLOTS
    assert all(key_slot(f"x{{{tag}}}".encode()) == slot for slot, tag in enumerate(tags))


def test_a_published_version_is_copied_into_every_slot_before_the_version_key(cluster):
    published = limiter().bump_config_version()
    client = cluster.client()
    assert client.get(VERSION_KEY).decode() == published
    sample = range(0, SLOTS, 997)
    assert {client.get(version_copy_key(VERSION_KEY, slot)).decode() for slot in sample} == \
        {published}


def test_a_new_global_rule_binds_the_first_decisions_on_a_cluster(cluster, free_plan):
    """The scenario that over-granted: a worker whose rules predate a new global rule."""
    other = worker()
    try:
        other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        Rule.objects.create(name="everyone", scope=Scope.GLOBAL, rate=1, period_s=3600,
                            burst=5)
        publish_elsewhere()  # what its commit does
        ips = [f"198.51.100.{n}" for n in range(1, 13)]  # clients in many slots
        allowed = [other.decide(ip_request(ip), AnonymousUser(), "hello", now_ms=T0).allowed
                   for ip in ips]
        assert allowed == [True] * 5 + [False] * 7  # exactly the new global burst
    finally:
        other.close()


def test_a_slot_whose_copy_was_lost_is_repaired_and_debited_once(cluster, free_plan):
    Rule.objects.create(name="everyone", scope=Scope.GLOBAL, rate=1, period_s=60, burst=100)
    publish_elsewhere()
    other = worker()
    try:
        first = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        keys_by_name = {p.name: p for p in first.policies}
        assert set(keys_by_name) == {"free-ip", "everyone"}
        # a node restarted without persistence lost the client's slot's copy of the version
        client_key = next(p.key for p in first.policies if p.name == "free-ip")
        copy = version_copy_key(VERSION_KEY, key_slot(client_key.encode()))
        cluster.client().delete(copy)

        second = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert second.allowed
        # each bucket debited once per decision: the fenced group's partner was refunded
        assert [p.remaining for p in second.policies] == [98, 98]
        assert cluster.client().get(copy).decode() == other.snapshot().version
    finally:
        other.close()


def test_a_lost_version_key_is_set_forwards_from_the_rules_a_worker_holds(cluster, free_plan):
    """A node restarted empty (or flushed) lost the version key and the client's slot's copy:
    the fenced worker waits for a publication, then finishes it forwards with the version it
    holds (its rows are the database's), and decides."""
    other = worker()
    try:
        first = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        held = other.snapshot().version
        client_key = first.policies[0].key
        copy = version_copy_key(VERSION_KEY, key_slot(client_key.encode()))
        client = cluster.client()
        client.delete(VERSION_KEY, copy)

        second = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert second.allowed and [p.remaining for p in second.policies] == [98]
        assert client.get(VERSION_KEY).decode() == held
        assert client.get(copy).decode() == held
    finally:
        other.close()


def test_a_publication_under_way_is_never_repaired_backwards(cluster, free_plan):
    """A publication writes every slot's copy before the version key: a worker fenced by a
    copy newer than the version key compiles the new rows as that version, and writes
    nothing back (a repair would undo the publication)."""
    held = limiter().read_version()  # free_plan's publication
    other = worker()
    try:
        other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        Rule.objects.filter(name="free-ip").update(burst=200)  # committed, then published:
        newer = f"{int(held.split('-')[0]) + 1000}-{'f' * 16}"
        limiter().store.write_version_copies(VERSION_KEY, newer)  # ... its copies so far
        decision = other.decide(ip_request(), AnonymousUser(), "hello", now_ms=T0)
        assert decision.allowed and decision.policies[0].burst == 200
        assert other.snapshot().version == newer
        client = cluster.client()
        assert client.get(VERSION_KEY).decode() == held  # left to the publication
        assert {client.get(version_copy_key(VERSION_KEY, slot)).decode()
                for slot in range(0, SLOTS, 997)} == {newer}
    finally:
        other.close()
