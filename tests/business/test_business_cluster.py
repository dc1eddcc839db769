"""The business parts of issue 20 on the session's real 3-master Redis Cluster with replicas, and
across a Redis restart or a master killed and its replica promoted.

What is shown: alerts of identities whose buckets live on different masters are stored once per
identity, rule, threshold and period, signalled once and delivered signed to a real receiver;
dated overrides and plan assignments switch the limits the cluster store enforces at their
times (test clock); across a restart or a failover no stored alert or rolled-up usage is lost,
no crossing is stored or delivered twice, and a flush cut off half-way counts no usage twice.
(The usage records' refund test on the cluster is in test_usage_records.py; the audit trail is
database-only.)
"""

import datetime
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.test import Client, RequestFactory

from ratelimit_app.business.alerts.models import (
    EVERY_ADDRESS_KEY,
    QuotaAlert,
    WebhookDelivery,
    WebhookEndpoint,
)
from ratelimit_app.business.alerts.webhooks import Sender, verify_signature
from ratelimit_app.business.usage.rollup import UsageRollup
from ratelimit_app.conf import DEFAULTS
from ratelimit_app.decision.keys import bucket_key, scope_token
from ratelimit_app.metrics import fields
from ratelimit_app.models import IdentityOverride, Plan, PlanAssignment, Rule, UsageRecord

from ..conftest import caches_for
from ..helpers import api_key, limiter, poll_until, use_fake_clock
from .reply_dropping_proxy import ReplyDroppingProxy

pytestmark = pytest.mark.django_db

# 2023-11-14 22:00:00 UTC: the start of a clock hour
HOUR_START_MS = 1_699_999_200_000
DAY_START = "2023-11-14T00:00:00+00:00"
# failure tests: a dead master costs a request half a second, not the suite's default 5 s
QUICK_OPTIONS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.25}


def saved_rule(**fields):
    rule = Rule(**fields)
    rule.full_clean()
    rule.save()
    return rule


def daily_quota(rate=5, scope="ip"):
    """A calendar quota of ``rate`` units a day alerting at 80 and 100 %."""
    return saved_rule(name="daily", scope=scope, kind="calendar", calendar_period="day",
                      rate=rate, alert_thresholds="80,100")


def one_ip_per_master(cluster):
    """Return one client address per master (in the masters' order) whose ip bucket lives on
    it."""
    by_port = {}
    for n in range(1, 255):
        address = f"198.51.100.{n}"
        owner = cluster.master_of(bucket_key("rl", scope_token("ip", address)))
        by_port.setdefault(owner.port, address)
        if len(by_port) == len(cluster.masters()):
            return [by_port[master.port] for master in cluster.masters()]
    raise AssertionError("no address for some master")


ALERTS_AGGREGATE_S = DEFAULTS["ALERTS_AGGREGATE_S"]


def alert_rows():
    """``[(identity key, threshold, used, limit)]`` of every stored alert, sorted."""
    return sorted(QuotaAlert.objects.values_list("identity_key", "threshold", "used", "limit"))


def cluster_bucket_keys(cluster):
    return {key.decode() for master in cluster.masters()
            for key in master.client().keys("rl:{*")}


# --- (i) alerts of identities on three masters ------------------------------------------------

def test_alerts_on_three_masters_are_stored_signalled_and_delivered_once(
        cluster, received, receiver, redis_client):
    use_fake_clock(now_ms=HOUR_START_MS)
    endpoint = WebhookEndpoint.objects.create(name="receiver", url=receiver.url)
    daily_quota()
    # a roomy global bucket: every decision spans two slot groups, and the quota's refusals
    # refund it
    saved_rule(name="global", scope="global", rate=1000, period_s=3600, burst=1000)
    addresses = one_ip_per_master(cluster)
    keys = [bucket_key("rl", scope_token("ip", address)) for address in addresses]
    assert len({cluster.master_of(key).port for key in keys}) == 3

    client = Client()
    for address in addresses:
        codes = [client.get("/hello/", REMOTE_ADDR=address).status_code for _ in range(6)]
        assert codes == [200] * 5 + [429]
    assert set(keys) <= cluster_bucket_keys(cluster)
    assert redis_client.keys("rl:{*") == []  # decided by the cluster store, not the single node

    queue = limiter().alerts
    assert queue.pending() == 6  # 80 % and 100 % of each address; the refusals: nothing
    stored = queue.drain()
    # a client-IP rule: one row per threshold for every address, which counts the three
    expected = [(EVERY_ADDRESS_KEY, 80, 4, 5), (EVERY_ADDRESS_KEY, 100, 5, 5)]
    assert alert_rows() == expected
    assert [a.callers for a in stored] == [3, 3]
    assert sorted(c["identity_key"] for c in stored[0].top_callers) == sorted(keys)
    assert {a.period_start.isoformat() for a in stored} == {DAY_START}
    assert sorted(a.pk for a in received) == sorted(a.pk for a in stored)

    # the same crossings seen again (another worker, or the buckets refilled after a failover
    # that lost their levels): this process queues none of them again; another worker (one
    # that has not seen them: forget) queues them, and they make no row, no signal, no delivery
    cluster.flushall()
    for address in addresses:
        assert [client.get("/hello/", REMOTE_ADDR=address).status_code
                for _ in range(4)] == [200] * 4
    assert queue.pending() == 0
    cluster.flushall()
    queue.reported.forget()
    for address in addresses:
        assert [client.get("/hello/", REMOTE_ADDR=address).status_code
                for _ in range(5)] == [200] * 5
    assert queue.pending() == 6
    assert queue.drain() == []
    assert alert_rows() == expected and len(received) == 2
    assert [a.callers for a in QuotaAlert.objects.all()] == [3, 3]  # each address counted once

    later = Sender(clock=lambda: time.time() + ALERTS_AGGREGATE_S + 1)  # past the wait
    assert later.send_due() == (2, 0)
    assert later.send_due() == (0, 0)  # a restarted sender: nothing more
    assert len(receiver.received) == 2
    bodies = []
    for got in receiver.received:
        assert verify_signature(endpoint.secret, got.headers, got.body)
        bodies.append(got.body)
    assert len(set(bodies)) == 2
    assert set(WebhookDelivery.objects.values_list("status", "attempts")) == {("sent", 1)}


# --- (ii) dated overrides and plan assignments ------------------------------------------------

def at(clock, seconds):
    """The wall-clock datetime ``seconds`` after the test clock's now."""
    return datetime.datetime.fromtimestamp(clock.wall_time() + seconds, tz=datetime.timezone.utc)


def allowed(count, address="192.0.2.7", user=None):
    """Decide ``count`` requests to `hello`; return whether each was allowed (False when it
    was decided without the cluster)."""
    outcomes = []
    for _ in range(count):
        request = RequestFactory().get("/hello/", REMOTE_ADDR=address)
        decision = limiter().decide(request, user or AnonymousUser(), "hello")
        assert not decision.degraded
        outcomes.append(decision.allowed)
    return outcomes


def test_a_dated_override_and_plan_assignment_switch_the_cluster_limits_at_their_times(
        cluster, settings, redis_client):
    # rows are compared with the snapshot once an hour: a switch seen here is the schedule's
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_RELOAD_INTERVAL_S": 3600}
    clock = use_fake_clock()
    free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True,
                               default_for_authenticated=True)
    pro = Plan.objects.create(slug="pro", name="Pro")
    # one token an hour: what a phase spends is not refilled by the next phase
    saved_rule(name="free-client", plan=free, scope="user", rate=1, period_s=3600, burst=2)
    saved_rule(name="free-ip", plan=free, scope="ip", rate=1, period_s=3600, burst=2)
    saved_rule(name="pro-client", plan=pro, scope="user", rate=1, period_s=3600, burst=4)
    user = get_user_model().objects.create_user("acme")
    IdentityOverride.objects.create(ip="192.0.2.7", exempt=True, starts_at=at(clock, 90),
                                    ends_at=at(clock, 200), reason="launch week")
    PlanAssignment.objects.create(user=user, plan=pro, starts_at=at(clock, 300),
                                  ends_at=at(clock, 400))

    assert allowed(3) == [True, True, False]  # the free plan's 2
    clock.advance(90_000)  # the override starts: exempt
    assert allowed(5) == [True] * 5
    clock.advance(110_000)  # it ends: the bucket the free plan left empty refuses again
    assert allowed(1) == [False]

    assert allowed(3, "192.0.2.8", user) == [True, True, False]  # free: 2
    clock.advance(100_000)  # on pro from here: its own bucket of 4
    assert allowed(5, "192.0.2.9", user) == [True] * 4 + [False]
    clock.advance(100_000)  # back on free, whose bucket is still spent
    assert allowed(1, "192.0.2.10", user) == [False]

    user_key = bucket_key("rl", scope_token("user", str(user.pk)))
    assert user_key in cluster_bucket_keys(cluster)
    assert redis_client.keys("rl:{*") == []


# --- (iii) a restart, a failover ------------------------------------------------------------

def call(raw_key):
    """One request with ``raw_key``; return the response."""
    return Client().get("/hello/", HTTP_X_API_KEY=raw_key)


def flush_and_roll_up():
    assert limiter().flusher.flush_now() > 0
    return UsageRollup(limiter().store.metrics_client()).run()


def usage_of(key):
    return UsageRecord.objects.filter(identity=f"key:{key.id}").values_list(
        "units", "allowed", "refused").get()


def test_a_single_node_restart_loses_no_stored_alert_and_repeats_no_crossing(
        redis_server, received, receiver):
    """A redis-server without persistence killed and started again: the quota's level is gone,
    so the caller spends the day's quota again and crosses 80 and 100 % again; neither crossing
    is stored, signalled or delivered twice. Usage rolled up before the kill is kept; what was
    flushed to Redis and not yet rolled up is lost with Redis's memory (documented)."""
    use_fake_clock(now_ms=HOUR_START_MS)
    WebhookEndpoint.objects.create(name="receiver", url=receiver.url)
    daily_quota(scope="user")
    key, raw = api_key("ann")
    assert [call(raw).status_code for _ in range(5)] == [200] * 5
    assert [a.threshold for a in limiter().alerts.drain()] == [80, 100]
    flush_and_roll_up()
    assert usage_of(key) == (5, 5, 0)
    assert call(raw).status_code == 429
    assert limiter().flusher.flush_now() > 0  # the refusal: flushed, not rolled up

    redis_server.kill()
    redis_server.start()
    limiter().alerts.reported.forget()  # as a worker started since would: it has seen nothing
    responses = [call(raw) for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 5 + [429]  # the quota starts afresh
    assert not any(r.wsgi_request.ratelimit.degraded for r in responses)
    assert limiter().alerts.pending() == 2
    assert limiter().alerts.drain() == []
    assert sorted(QuotaAlert.objects.values_list("threshold", flat=True)) == [80, 100]
    assert sorted(a.threshold for a in received) == [80, 100]
    assert Sender().send_due() == (2, 0) and len(receiver.received) == 2

    flush_and_roll_up()
    assert usage_of(key) == (10, 10, 1)  # the refusal flushed before the kill is not here




def stall_writes(node, ms):
    """CLIENT PAUSE ``node``'s writes for ``ms``: its clients time out, their commands wait."""
    with node.client() as client:
        client.execute_command("CLIENT", "PAUSE", ms, "WRITE")


def resume_writes(node):
    with node.client() as client:
        client.execute_command("CLIENT", "UNPAUSE")


def test_a_flush_that_times_out_is_written_once(redis_server):
    """Redis stalls past the flush's socket timeout: the flush fails and keeps its counts; Redis
    drops the commands of the connection the client gave up, so the next flush writes the
    usage once."""
    use_fake_clock(now_ms=HOUR_START_MS)
    daily_quota(scope="user")
    key, raw = api_key("ann")
    assert [call(raw).status_code for _ in range(3)] == [200] * 3
    stall_writes(redis_server, 5000)
    assert limiter().flusher.flush_now() == 0
    resume_writes(redis_server)
    flush_and_roll_up()
    assert usage_of(key) == (3, 3, 0)


def test_a_flush_meeting_stalled_cluster_masters_counts_usage_once(cluster, settings):
    """The masters other than the {usage} one stall past the socket timeout while a flush
    writes to every master: the cluster pipeline retries their part until they answer; the
    usage written on the {usage} master is counted once."""
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CLUSTER_OPTIONS": QUICK_OPTIONS}
    use_fake_clock(now_ms=HOUR_START_MS)
    daily_quota(scope="user")
    key, raw = api_key("ann")
    assert [call(raw).status_code for _ in range(3)] == [200] * 3
    usage_master = cluster.master_of(fields.usage_pending_key("rl"))
    for master in cluster.masters():
        if master is not usage_master:
            stall_writes(master, 1000)  # twice the socket timeout
    flush_and_roll_up()
    assert usage_of(key) == (3, 3, 0)


def test_a_killed_master_s_replica_keeps_the_quota_usage_and_alerts_stay_once(
        cluster, settings, received, receiver):
    """kill -9 the master holding both the caller's quota and the pending usage; its replica is
    promoted. Once the replica holds what the master acknowledged (WAIT stands in for the few ms
    of asynchronous replication a kill could outrun), nothing is lost: the quota stays spent,
    the usage flushed before the kill is rolled up, and no crossing is stored twice."""
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CLUSTER_OPTIONS": QUICK_OPTIONS}
    use_fake_clock(now_ms=HOUR_START_MS)
    WebhookEndpoint.objects.create(name="receiver", url=receiver.url)
    daily_quota(scope="user")
    usage_key = fields.usage_pending_key("rl")
    usage_master = cluster.master_of(usage_key)
    for n in range(50):  # a caller whose bucket lives on the {usage} master
        key, raw = api_key(f"customer-{n}")
        bucket = bucket_key("rl", scope_token("key", key.pk))
        if cluster.master_of(bucket) is usage_master:
            break
    assert [call(raw).status_code for _ in range(4)] == [200] * 4  # 80 %
    assert bucket in cluster_bucket_keys(cluster)
    assert [a.threshold for a in limiter().alerts.drain()] == [80]
    flush_and_roll_up()
    assert call(raw).status_code == 200  # 100 %: queued, not stored yet
    assert limiter().flusher.flush_now() > 0  # flushed, not rolled up
    with usage_master.client() as client:
        assert client.execute_command("WAIT", 1, 5000) == 1

    old_master = cluster.kill_master_of(usage_key)
    try:
        assert [a.threshold for a in limiter().alerts.drain()] == [100]  # the database's
        cluster.wait_for_promotion(usage_key, old_master)
        served = []

        def served_again():
            response = call(raw)
            if not response.wsgi_request.ratelimit.degraded:
                served.append(response.status_code)
            return served

        poll_until(served_again, timeout_s=20, what="decisions on the promoted replica")
        assert served == [429]  # the replica had the quota's level: still spent
        poll_until(lambda: limiter().flusher.flush_now() > 0, what="a flush")
        UsageRollup(limiter().store.metrics_client()).run()
        assert usage_of(key) == (5, 5, 1)
        assert limiter().alerts.drain() == []
        assert sorted(QuotaAlert.objects.values_list("threshold", flat=True)) == [80, 100]
        assert sorted(a.threshold for a in received) == [80, 100]
        assert Sender().send_due() == (2, 0) and len(receiver.received) == 2
    finally:
        cluster.restart_node(old_master)


def test_a_threshold_crossed_by_a_request_whose_reply_is_lost_is_reported_by_the_next(
        redis_server, settings, received):
    """Redis debited the request that crossed 80 % and its reply was lost: that request was
    decided by the fail mode, so no worker saw its levels. The caller's next allowed request
    has reached 80 % and 100 %: both are reported, each once."""
    proxy = ReplyDroppingProxy(redis_server.port).start()
    try:
        settings.CACHES = caches_for(f"redis://127.0.0.1:{proxy.port}/0")
        use_fake_clock(now_ms=HOUR_START_MS)
        daily_quota(scope="user")
        key, raw = api_key("ann")
        assert [call(raw).status_code for _ in range(3)] == [200] * 3
        proxy.drop_replies_to = b"EVALSHA"
        lost = call(raw)  # the 4th unit of 5: 80 %
        assert lost.status_code == 200 and lost.wsgi_request.ratelimit.degraded == "fail-open"
        assert proxy.dropped == 1
        proxy.drop_replies_to = None
        assert call(raw).status_code == 200  # the 5th: 100 %
        assert call(raw).status_code == 429  # (the lost request was charged)
    finally:
        proxy.stop()
    assert [a.threshold for a in limiter().alerts.drain()] == [80, 100]
    # 80 %: reached before the reporting request, so its own mark (4 of 5)
    assert [(a.threshold, a.used) for a in received] == [(80, 4), (100, 5)]
