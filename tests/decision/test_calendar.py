"""Calendar quotas: N units per day or month, reset at the boundary in CALENDAR_TIME_ZONE, counted
in take.lua's atomic call beside the token buckets (decision/periods.py, buckets.CalendarQuota)."""

import dataclasses
import datetime
import zoneinfo

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ValidationError
from django.test import Client

from ratelimit_app.decision.buckets import CALENDAR_RECORD, read_state
from ratelimit_app.decision.engine import take_args
from ratelimit_app.models import Counts, Plan, Rule

from ..helpers import limiter, make_bucket, make_rule, take, use_fake_clock

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
DAY_S = 24 * 3600


def berlin_ms(*when):
    """Milliseconds since the epoch of a Berlin wall-clock time (year, month, day, ...)."""
    return int(datetime.datetime(*when, tzinfo=BERLIN).timestamp() * 1000)


@pytest.fixture
def in_berlin(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CALENDAR_TIME_ZONE": "Europe/Berlin",
                              "RETRY_AFTER_JITTER_S": 0, "RETRY_AFTER_JITTER_RATIO": 0}


def spend(bucket, times):
    return [take([bucket])[0] for _ in range(times)]


def test_counts_units_and_refuses_at_n_until_midnight(in_berlin):
    clock = use_fake_clock(now_ms=berlin_ms(2024, 6, 10, 15, 0))
    bucket = make_bucket(make_rule(rate=3, calendar="day"))
    assert spend(bucket, 4) == [True, True, True, False]
    allowed, statuses, _ = take([bucket])
    status = statuses[0]
    assert not allowed and status.short and status.remaining == 0
    assert status.reset_s == 9 * 3600 and status.window_s == DAY_S  # to 00:00 Berlin
    clock.now_ms = berlin_ms(2024, 6, 11) - 1
    assert not take([bucket])[0]
    clock.now_ms = berlin_ms(2024, 6, 11)  # exactly midnight in Berlin (22:00 UTC)
    allowed, statuses, _ = take([bucket])
    assert allowed and statuses[0].remaining == 2 and statuses[0].reset_s == DAY_S


@pytest.mark.parametrize("day, hours", [((2024, 3, 31), 23), ((2024, 10, 27), 25)])
def test_a_day_across_a_dst_change_lasts_its_real_length(in_berlin, day, hours):
    clock = use_fake_clock(now_ms=berlin_ms(*day, 0, 30))
    bucket = make_bucket(make_rule(rate=1, calendar="day"))
    allowed, statuses, _ = take([bucket])
    assert allowed and statuses[0].window_s == hours * 3600
    assert statuses[0].reset_s == hours * 3600 - 1800
    next_day = datetime.date(*day) + datetime.timedelta(days=1)
    clock.now_ms = berlin_ms(next_day.year, next_day.month, next_day.day) - 1
    assert not take([bucket])[0]
    clock.advance(1)
    assert take([bucket])[0]


def test_a_month_resets_on_the_first_including_february(in_berlin):
    clock = use_fake_clock(now_ms=berlin_ms(2024, 2, 29, 23, 59))  # a leap year
    bucket = make_bucket(make_rule(rate=2, calendar="month"))
    assert spend(bucket, 3) == [True, True, False]
    _, statuses, _ = take([bucket], debit=False)
    assert statuses[0].window_s == 29 * DAY_S and statuses[0].reset_s == 60
    clock.now_ms = berlin_ms(2024, 3, 1)
    allowed, statuses, _ = take([bucket])
    # March in Berlin: 31 days less the hour of the DST change
    assert allowed and statuses[0].remaining == 1 and statuses[0].window_s == 31 * DAY_S - 3600


def test_the_redis_clock_decides_the_period_whatever_the_app_servers_clock(in_berlin):
    # two app servers 2 minutes either side of Redis, just before and after the boundary
    use_fake_clock()
    bucket = make_bucket(make_rule(rate=1, calendar="day"))
    store, midnight = limiter().store, berlin_ms(2024, 6, 11)

    def take_at(redis_now, host_now):
        args = [redis_now, b"1", bucket.spec_at(host_now)]
        return store.take([bucket.key], args, version_key="rl:version").allowed

    assert take_at(midnight - 1000, host_now=midnight + 120_000)  # the old day's unit
    assert not take_at(midnight - 500, host_now=midnight - 120_000)
    assert not take_at(midnight - 100, host_now=midnight + 120_000)  # ahead, but not yet
    assert take_at(midnight, host_now=midnight - 120_000)  # behind, but Redis says: new day
    assert not take_at(midnight + 1, host_now=midnight + 120_000)


@pytest.mark.parametrize("short", ["calendar", "bucket"])
def test_all_or_nothing_with_a_token_bucket_on_the_same_key(in_berlin, redis_client, short):
    use_fake_clock(now_ms=berlin_ms(2024, 6, 10, 12))
    quota = make_bucket(make_rule(rate=1 if short == "calendar" else 10, calendar="day"))
    bucket = make_bucket(make_rule(rate=1, period_s=3600, burst=1 if short == "bucket" else 10))
    assert quota.key == bucket.key  # one identity: two records in one key
    assert take([quota, bucket])[0]
    before = redis_client.get(quota.key)
    allowed, statuses, _ = take([quota, bucket])
    assert not allowed
    assert redis_client.get(quota.key) == before  # neither counted nor debited
    assert [s.short for s in statuses] == [short == "calendar", short == "bucket"]


def test_all_or_nothing_across_keys(in_berlin, redis_client):
    use_fake_clock(now_ms=berlin_ms(2024, 6, 10, 12))
    quota = make_bucket(make_rule(rate=5, calendar="month", scope="tenant"), token="tenant.a")
    bucket = make_bucket(make_rule(rate=1, period_s=3600, burst=1), token="user.a")
    assert take([quota, bucket])[0]
    assert not take([quota, bucket])[0]
    assert read_state(redis_client.get(quota.key), quota.rule.id)[0] == 1  # used once only


def test_an_edit_of_n_keeps_the_usage_of_the_period(in_berlin, redis_client):
    use_fake_clock(now_ms=berlin_ms(2024, 6, 10, 12))
    rule = make_rule(rate=10, calendar="month")
    assert spend(make_bucket(rule), 4) == [True] * 4
    used, start, kind = read_state(redis_client.get(make_bucket(rule).key), rule.id)
    assert (used, start, kind) == (4, berlin_ms(2024, 6, 1), CALENDAR_RECORD)
    raised = make_bucket(dataclasses.replace(rule, rate=6, burst=6))
    allowed, statuses, _ = take([raised])
    assert allowed and statuses[0].remaining == 1  # 6 - 5 used
    lowered = make_bucket(dataclasses.replace(rule, rate=3, burst=3))
    allowed, statuses, _ = take([lowered])
    assert not allowed and statuses[0].remaining == 0


def test_the_key_lives_until_the_periods_end(in_berlin, redis_client):
    now = berlin_ms(2024, 6, 10, 12)
    use_fake_clock(now_ms=now)
    until_end = berlin_ms(2024, 7, 1) + 1000 - now  # the period's end + the script's slack
    quota = make_bucket(make_rule(rate=5, calendar="month"))
    # a token bucket of the same identity that is full again in one minute shares the key
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=1))
    assert take([bucket])[0]
    assert 0 < redis_client.pttl(bucket.key) <= 61_000
    assert take([quota])[0]
    assert until_end - 5000 < redis_client.pttl(quota.key) <= until_end
    assert take([quota, bucket]) and take([quota])[0]  # later writes never shorten it
    assert until_end - 5000 < redis_client.pttl(quota.key) <= until_end


def test_a_rule_changing_kind_starts_afresh(in_berlin):
    use_fake_clock(now_ms=berlin_ms(2024, 6, 10, 12))
    quota_rule = make_rule(rate=1, calendar="day")
    assert spend(make_bucket(quota_rule), 2) == [True, False]
    as_bucket = make_bucket(dataclasses.replace(quota_rule, calendar="", rate=1, period_s=60,
                                                burst=2))
    allowed, statuses, _ = take([as_bucket])
    assert allowed and statuses[0].remaining == 1  # the calendar record read as a full bucket
    allowed, statuses, _ = take([make_bucket(quota_rule)])
    assert allowed and statuses[0].remaining == 0  # the bucket's record counts as 0 used


# --- Redis Cluster: a refused decision gives calendar units back -----------------------------

@pytest.mark.slow
def test_a_refund_on_a_cluster_gives_units_back_never_below_zero(redis_cluster, settings):
    from ..stores.test_cluster import token_per_master

    redis_cluster.ensure_healthy()
    redis_cluster.flushall()
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP,
                              "CLUSTER_NODES": [redis_cluster.nodes[0].address],
                              "CALENDAR_TIME_ZONE": "Europe/Berlin"}
    use_fake_clock(now_ms=berlin_ms(2024, 6, 10, 12))
    tokens = token_per_master(redis_cluster)
    quota = make_bucket(make_rule(rate=5, calendar="month", scope="tenant"), token=tokens[0])
    bucket = make_bucket(make_rule(rate=1, period_s=3600, burst=1), token=tokens[1])
    assert take([quota, bucket])[0]  # 1 used
    allowed, statuses, _ = take([quota, bucket])  # the quota's slot debits, the bucket refuses
    assert not allowed and statuses[0].remaining == 4
    with redis_cluster.client() as client:  # closed: redis-py 8.2 warns of a socket left to GC
        assert read_state(client.get(quota.key), quota.rule.id)[0] == 1

    store, args = limiter().store, take_args([quota])
    assert store.refund([quota.key], args, refund_id="one") == [5]
    assert store.refund([quota.key], args, refund_id="two") == [5]  # nothing left to give back
    with redis_cluster.client() as client:
        assert read_state(client.get(quota.key), quota.rule.id)[0] == 0


# --- rules in the database: admin validation, headers, 429, usage endpoint --------------------

def calendar_rule(**fields):
    rule = Rule(**{"name": "monthly", "scope": "ip", "kind": "calendar",
                   "calendar_period": "month", "rate": 3, **fields})
    rule.full_clean()
    rule.save()
    return rule


@pytest.mark.django_db
def test_a_calendar_rule_is_validated_in_words_an_operator_understands():
    rule = calendar_rule()
    assert (rule.burst, rule.period_s) == (3, 31 * DAY_S) and rule.describe().startswith("3 requests per month")
    cases = [({"calendar_period": ""}, "calendar_period", "every day or every month"),
             ({"counts": Counts.FAILED_AUTH}, "kind", "token bucket"),
             ({"lease": 1, "scope": "global"}, "lease", "Leases are for token buckets")]
    for fields, field, words in cases:
        with pytest.raises(ValidationError) as refused:
            Rule(**{"name": "x", "scope": "ip", "kind": "calendar", "calendar_period": "day",
                    "rate": 5, **fields}).full_clean()
        assert words in " ".join(refused.value.message_dict[field])
    with pytest.raises(ValidationError) as refused:
        Rule(name="y", scope="ip", rate=5).full_clean()  # a token bucket needs its numbers
    assert set(refused.value.message_dict) >= {"period_s", "burst"}


def test_the_time_zone_setting_is_checked(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CALENDAR_TIME_ZONE": "Mars/Olympus"}
    assert "ratelimit_app.E007" in [m.id for m in run_checks(tags=["ratelimit_app"])]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CALENDAR_TIME_ZONE": "Europe/Berlin"}
    assert "ratelimit_app.E007" not in [m.id for m in run_checks(tags=["ratelimit_app"])]


@pytest.mark.django_db
def test_headers_429_and_usage_endpoint_show_the_boundary(in_berlin):
    Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    calendar_rule()
    now = berlin_ms(2024, 2, 10, 12)
    use_fake_clock(now_ms=now)
    to_boundary = (berlin_ms(2024, 3, 1) - now) // 1000
    client = Client()
    first = client.get("/hello/")
    assert first.status_code == 200
    assert first["RateLimit-Policy"] == f'"monthly";q=3;w={29 * DAY_S}'
    assert first["RateLimit"] == f'"monthly";r=2;t={to_boundary}'

    usage = client.get("/ratelimit/usage/").json()["policies"]
    assert usage == [{"name": "monthly", "scope": "ip", "endpoint": None, "shared": False,
                      "limit": 3, "window": 29 * DAY_S, "calendar_period": "month",
                      "remaining": 2, "reset": to_boundary,
                      "reset_at": "2024-02-29T23:00:00+00:00"}]  # 1 March, 00:00 in Berlin

    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
    refused = client.get("/hello/")
    assert refused.status_code == 429
    assert refused["Retry-After"] == str(to_boundary)
    assert refused.json()["retry-after"] == to_boundary
    assert refused["RateLimit"] == f'"monthly";r=0;t={to_boundary}'
