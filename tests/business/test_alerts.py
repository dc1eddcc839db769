"""Quota alerts (business/alerts/crossings.py): a rule's thresholds, crossings learnt from the
decision's levels on
the request path (no query, no extra Redis call), stored once per identity, rule, threshold and
period, the signal quota_threshold_crossed once per stored row, and the outbox rows written with
them."""

import dataclasses
import json
import time

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from ratelimit_app.business.alerts.crossings import ReportedCrossings, crossings
from ratelimit_app.business.alerts.models import QuotaAlert, WebhookDelivery, WebhookEndpoint
from ratelimit_app.models import ALERT_MIN_PERIOD_S, Rule, parse_alert_thresholds

from ..helpers import limiter, make_bucket, make_rule, take, use_fake_clock

# 2023-11-14 22:00:00 UTC: the start of a clock hour (token-bucket alert windows are aligned)
HOUR_START_MS = 1_699_999_200_000
HOUR_MS = 3600 * 1000


def calendar_rule(**fields):
    fields = {"name": "daily", "scope": "ip", "kind": "calendar", "calendar_period": "day",
              "rate": 5, "alert_thresholds": "80,100", **fields}
    rule = Rule(**fields)
    rule.full_clean()
    rule.save()
    return rule


# --- the rule's field ------------------------------------------------------------------------

def test_thresholds_are_parsed_sorted_and_bounded():
    assert parse_alert_thresholds("100, 80,80") == (80, 100)
    for bad in ("80,", "abc", "0", "101", "80;100", "-5"):
        with pytest.raises(ValueError, match="percent from 1 to 100"):
            parse_alert_thresholds(bad)
    with pytest.raises(ValueError, match="At most 10"):
        parse_alert_thresholds(",".join(str(n) for n in range(1, 12)))


@pytest.mark.django_db
def test_clean_normalises_and_refuses_what_cannot_alert():
    rule = calendar_rule(alert_thresholds="100, 80")
    assert rule.alert_thresholds == "80,100"

    fast = Rule(name="fast", scope="ip", rate=10, period_s=60, burst=10, alert_thresholds="80")
    with pytest.raises(ValidationError) as caught:
        fast.full_clean()
    assert f"at least {ALERT_MIN_PERIOD_S} s" in caught.value.message_dict["alert_thresholds"][0]

    hourly = Rule(name="hourly", scope="ip", rate=100, period_s=ALERT_MIN_PERIOD_S, burst=100,
                  alert_thresholds="90")
    hourly.full_clean()  # long enough

    inflight = Rule(name="inflight", scope="ip", kind="concurrency", rate=2, period_s=30,
                    alert_thresholds="100")
    with pytest.raises(ValidationError) as caught:
        inflight.full_clean()
    assert "calendar quotas and token buckets" in caught.value.message_dict["alert_thresholds"][0]

    typo = Rule(name="typo", scope="ip", kind="calendar", calendar_period="day", rate=5,
                alert_thresholds="80%")
    with pytest.raises(ValidationError) as caught:
        typo.full_clean()
    assert "“80%” is not a percent" in caught.value.message_dict["alert_thresholds"][0]


# --- detection -------------------------------------------------------------------------------

def test_a_threshold_is_reached_by_every_allowed_request_at_or_past_it_and_queued_once():
    use_fake_clock(now_ms=HOUR_START_MS)
    rule = dataclasses.replace(make_rule(rate=10, calendar="day"), alerts=(50, 100))
    bucket = make_bucket(rule, cost=3)
    seen = []
    for _ in range(4):  # used 3, 6, 9, then refused (12 > 10)
        allowed, statuses, _ = take([bucket])
        seen.append(crossings([bucket], statuses, None, HOUR_START_MS) if allowed else None)
    assert [None if c is None else [x.threshold for x in c] for c in seen] == \
        [[], [50], [50], None]
    # crossed by the request: the usage it left; reached before it: the threshold's own mark
    assert seen[1][0].used == 6 and seen[2][0].used == 5
    # what a process queues: the first request that reached it in the period
    reported = ReportedCrossings()
    assert [[x.threshold for x in reported.new(c)] for c in seen[:3]] == [[], [50], []]
    bounded = ReportedCrossings(capacity=1)  # full: starts afresh (the database dedupes)
    other = (seen[1][0]._replace(identity_key="rl:{ip.other}"),)
    assert bounded.new(seen[1]) and not bounded.new(seen[1])
    assert bounded.new(other) and bounded.new(seen[1])  # forgotten when the other came
    assert seen[1][0].used == 6 and seen[1][0].limit == 10
    # the day in UTC (CALENDAR_TIME_ZONE), whatever the hour
    assert seen[1][0].period_start_ms == HOUR_START_MS - 22 * HOUR_MS


@pytest.mark.django_db
def test_requests_queue_crossings_without_a_query_and_a_drain_stores_each_once(
        django_assert_num_queries, received):
    use_fake_clock(now_ms=HOUR_START_MS)
    rule = calendar_rule()
    client = Client()
    assert client.get("/hello/").status_code == 200  # compiles the snapshot (queries)
    with django_assert_num_queries(0):
        codes = [client.get("/hello/").status_code for _ in range(5)]
    assert codes == [200, 200, 200, 200, 429]
    queue = limiter().alerts
    assert queue.pending() == 2  # 4 of 5 used (80 %), then 5 of 5 (100 %); the 429: nothing

    stored = queue.drain()
    assert [(a.threshold, a.used, a.limit) for a in stored] == [(80, 4, 5), (100, 5, 5)]
    assert [a.pk for a in received] == [a.pk for a in stored]  # one signal per stored row
    alert = QuotaAlert.objects.get(threshold=80)
    assert alert.rule == rule and alert.identity.startswith("ip:127.0.0.1")
    assert alert.period_start.isoformat() == "2023-11-14T00:00:00+00:00"

    # another worker reporting the same crossings (or this one again): no row, no signal
    queue.put(tuple(crossing_of(a) for a in stored))
    assert queue.drain() == []
    assert QuotaAlert.objects.count() == 2 and len(received) == 2


def crossing_of(alert):
    from ratelimit_app.business.alerts.crossings import Crossing

    return Crossing(alert.rule_id, alert.identity_key, "another worker", alert.threshold,
                    int(alert.period_start.timestamp() * 1000), alert.used, alert.limit)


@pytest.mark.django_db
def test_a_refilled_token_bucket_alerts_again_only_in_its_next_window(received):
    clock = use_fake_clock(now_ms=HOUR_START_MS + 60_000)
    Rule.objects.create(name="hourly", scope="ip", rate=4, period_s=3600, burst=4,
                        alert_thresholds="100")
    client = Client()
    queue = limiter().alerts

    def spend_all():
        codes = [client.get("/hello/").status_code for _ in range(5)]
        assert codes == [200] * 4 + [429]
        return queue.drain()

    assert [a.threshold for a in spend_all()] == [100]
    clock.advance(HOUR_MS // 2 + 60_000)  # refilled 2+ tokens, same clock hour: seen, not stored
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
    assert queue.drain() == []
    clock.advance(HOUR_MS)  # the next window: full again, and a new alert
    assert [a.threshold for a in spend_all()] == [100]
    assert QuotaAlert.objects.count() == 2 and len(received) == 2


@pytest.mark.django_db
def test_deliveries_are_written_with_the_alert_for_subscribed_endpoints():
    use_fake_clock(now_ms=HOUR_START_MS)
    calendar_rule()
    everything = WebhookEndpoint.objects.create(name="all", url="http://127.0.0.1:9/a")
    exhausted = WebhookEndpoint.objects.create(name="exhausted", url="http://127.0.0.1:9/b",
                                               events="quota.exhausted")
    WebhookEndpoint.objects.create(name="off", url="http://127.0.0.1:9/c", enabled=False)
    client = Client()
    for _ in range(5):
        client.get("/hello/")
    limiter().alerts.drain()
    rows = sorted((d.endpoint.name, d.event, d.status) for d in WebhookDelivery.objects.all())
    assert rows == [("all", "quota.exhausted", "pending"),
                    ("all", "quota.threshold_crossed", "pending"),
                    ("exhausted", "quota.exhausted", "pending")]
    assert everything.deliveries.count() == 2 and exhausted.deliveries.count() == 1


def test_a_full_queue_drops_and_counts(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "ALERTS_QUEUE_SIZE": 1}
    queue = limiter().alerts
    from ratelimit_app.business.alerts.crossings import Crossing

    one = Crossing(1, "rl:{ip.x}", "", 80, 0, 4, 5)
    queue.put((one,))
    queue.put((one._replace(threshold=100),))
    assert queue.pending() == 1 and queue.dropped == 1


@pytest.mark.django_db
def test_thresholds_written_without_clean_are_ignored_not_fatal(caplog):
    use_fake_clock(now_ms=HOUR_START_MS)
    rule = calendar_rule()
    Rule.objects.filter(pk=rule.pk).update(alert_thresholds="80,lots")  # no clean(), no signal
    snapshot = limiter().snapshot()
    compiled = next(r for r in snapshot.rules if r.id == rule.id)
    assert compiled.alerts == () and not snapshot.has_alerts
    assert "alert thresholds '80,lots' ignored" in caplog.text
    assert Client().get("/hello/").status_code == 200  # the rule itself still applies


def test_a_request_holding_a_concurrency_slot_on_the_async_path_detects_crossings(db):
    from asgiref.sync import async_to_sync
    from django.contrib.auth.models import AnonymousUser
    from django.test import RequestFactory

    use_fake_clock(now_ms=HOUR_START_MS)
    calendar_rule(rate=4, alert_thresholds="50")  # crossed by the 2nd request
    Rule.objects.create(name="inflight", scope="ip", kind="concurrency", rate=5, period_s=30,
                        burst=5)

    def adecide():
        async def run():
            try:
                return await limiter().adecide(RequestFactory().get("/", REMOTE_ADDR="192.0.2.1"),
                                               AnonymousUser(), "hello")
            finally:
                await limiter().async_store().aclose()
        return async_to_sync(run)()

    first, second = adecide(), adecide()
    assert first.allowed and second.allowed and second.slot is not None  # the slot path
    assert [c.threshold for c in limiter().alerts._queue] == [50]
    assert [(a.threshold, a.used) for a in limiter().alerts.drain()] == [(50, 2)]
    for decision in (first, second):
        limiter().release_slot(decision)


# --- a client-IP rule: one alert for every address ---------------------------------------------

@pytest.mark.django_db
def test_300_addresses_crossing_in_a_minute_make_one_alert_and_one_delivery_per_threshold(
        received):
    clock = use_fake_clock(now_ms=HOUR_START_MS)
    calendar_rule(rate=2, alert_thresholds="50,100")  # each address: 1 of 2, then 2 of 2
    WebhookEndpoint.objects.create(name="all", url="http://127.0.0.1:9/a")
    client = Client()
    for n in range(300):  # 300 IPv6 /64 networks, within a minute
        address = f"2001:db8:{n // 256:x}:{n % 256:x}::1"
        for _ in range(1 + (n == 7)):  # one of them uses it all (both thresholds)
            assert client.get("/hello/", REMOTE_ADDR=address).status_code == 200
        clock.advance(150)
    limiter().alerts.drain()
    alerts = {a.threshold: a for a in QuotaAlert.objects.all()}
    assert set(alerts) == {50, 100} and len(received) == 2  # one row (and signal) per threshold
    half, full = alerts[50], alerts[100]
    assert half.aggregated and half.callers == 300 and full.callers == 1
    assert len(half.top_callers) == 5  # the few that used the most, not all 300
    assert {caller["used"] for caller in half.top_callers} == {1}  # what the crossing left
    assert full.top_callers == [{"identity": "ip:2001:db8:0:7::/64 (2001:db8:0:7::/64)",
                                 "identity_key": full.top_callers[0]["identity_key"], "used": 2}]
    assert (full.identity, full.used, full.limit) == (full.top_callers[0]["identity"], 2, 2)
    deliveries = list(WebhookDelivery.objects.order_by("event"))
    assert [d.event for d in deliveries] == ["quota.exhausted", "quota.threshold_crossed"]
    body = json.loads(next(d.body for d in deliveries if d.alert_id == half.pk))["data"]
    assert body["callers"] == 300 and len(body["top_callers"]) == 5
    assert body["top_callers"][0] == {"identity": half.top_callers[0]["identity"], "used": 1}


@pytest.mark.django_db
def test_an_aggregated_delivery_waits_and_is_rewritten_until_sent(settings):
    from ratelimit_app.business.alerts.webhooks import Sender

    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "ALERTS_AGGREGATE_S": 60}
    use_fake_clock(now_ms=HOUR_START_MS)
    calendar_rule(rate=1, alert_thresholds="100")
    WebhookEndpoint.objects.create(name="all", url="http://127.0.0.1:9/a")
    client = Client()
    assert client.get("/hello/", REMOTE_ADDR="198.51.100.1").status_code == 200
    limiter().alerts.drain()  # the row and its delivery, due in 60 s
    delivery = WebhookDelivery.objects.get()
    assert Sender().claim(10) == []  # not due yet
    assert json.loads(delivery.body)["data"]["callers"] == 1
    for address in ("198.51.100.2", "198.51.100.3"):  # stored by a later drain
        assert client.get("/hello/", REMOTE_ADDR=address).status_code == 200
    limiter().alerts.drain()
    delivery.refresh_from_db()
    assert json.loads(delivery.body)["data"]["callers"] == 3
    assert QuotaAlert.objects.get().callers == 3
    late = Sender(clock=lambda: time.time() + 61)  # the clock seam: past the wait
    assert [d.pk for d in late.claim(10)] == [delivery.pk]
    assert client.get("/hello/", REMOTE_ADDR="198.51.100.4").status_code == 200
    limiter().alerts.drain()
    delivery.refresh_from_db()
    assert json.loads(delivery.body)["data"]["callers"] == 3  # taken by a sender: as it was
    assert QuotaAlert.objects.get().callers == 4  # the row still counts


def test_an_address_reported_by_two_workers_is_counted_once_while_among_the_top(db):
    from ratelimit_app.business.alerts.crossings import Crossing, store_crossings

    rule = calendar_rule()
    first = Crossing(rule.id, "rl:{ip.a}", "ip:192.0.2.1", 80, HOUR_START_MS, 4, 5, True)
    assert len(store_crossings([first])) == 1
    assert store_crossings([first._replace(identity="ip:192.0.2.1 (again)")]) == []
    assert QuotaAlert.objects.get().callers == 1
    store_crossings([first._replace(identity_key="rl:{ip.b}", identity="ip:192.0.2.2", used=5)])
    alert = QuotaAlert.objects.get()
    assert alert.callers == 2 and [c["identity"] for c in alert.top_callers] == \
        ["ip:192.0.2.2", "ip:192.0.2.1"]
    assert (alert.identity, alert.used) == ("ip:192.0.2.2", 5)


@pytest.mark.django_db
def test_the_admin_lists_an_aggregated_alert_as_its_count_of_addresses(admin_client):
    from ratelimit_app.business.alerts.crossings import Crossing, store_crossings

    rule = calendar_rule()
    store_crossings([Crossing(rule.id, f"rl:{{ip.{n}}}", f"ip:192.0.2.{n} (192.0.2.{n})", 80,
                              HOUR_START_MS, 4, 5, True) for n in range(1, 8)])
    html = admin_client.get("/admin/ratelimit_alerts/quotaalert/").content.decode()
    assert "7 addresses, the most by ip:192.0.2.1 (192.0.2.1)" in html
    assert "80 % (4 of 5 used)" in html
