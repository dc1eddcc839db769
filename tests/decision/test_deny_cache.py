"""The local deny cache answers only what Redis would answer: checked against the real script
with an injected clock mapped onto the Redis time the script is given."""

import random

from django.test import Client, RequestFactory

from ratelimit_app.decision.buckets import Bucket
from ratelimit_app.decision.deny_cache import SAFETY_MARGIN_S, DenyCache
from ratelimit_app.models import Plan, Rule, Scope

from ..helpers import decide, limiter, load_demo_data, make_bucket, make_rule, take, use_fake_clock

T0 = 1_700_000_000_000   # Redis time (ms) at the start of a test
C0 = 5_000.0             # the cache's clock (s) at that moment: any offset works
MARGIN_MS = round(SAFETY_MARGIN_S * 1000)


class Clocks:
    """One elapsed time, read by the cache in seconds and given to Redis in milliseconds."""

    def __init__(self):
        self.elapsed_ms = 0

    def cache_s(self):
        return C0 + self.elapsed_ms / 1000

    def redis_ms(self):
        return T0 + self.elapsed_ms


def redis_denies(buckets, now_ms):
    """Ask the real script, without debiting, whether ``buckets`` would be denied now."""
    allowed, _, _ = take(buckets, now_ms=now_ms, debit=False)
    return not allowed


def deny_in_redis_and_remember(cache, buckets, clocks):
    """Spend ``buckets`` until Redis denies at the current time; remember that denial."""
    for _ in range(10_000):
        sent_at = clocks.cache_s()
        allowed, statuses, version = take(buckets, now_ms=clocks.redis_ms())
        if not allowed:
            cache.remember(buckets, statuses, version, sent_at)
            return version
    raise AssertionError("never denied")


def test_denies_only_while_the_upper_bound_is_below_the_cost():
    clocks = Clocks()
    cache = DenyCache(clock=clocks.cache_s)
    rule = make_rule(rate=2, period_s=10, burst=3)  # a token every 5 s
    bucket = make_bucket(rule)
    version = deny_in_redis_and_remember(cache, [bucket], clocks)

    # Redis has the token back when rate x elapsed reaches one token's units.
    redis_allows_at_ms = bucket.period_ms // rule.rate
    assert redis_allows_at_ms == 5_000
    for elapsed_ms in (0, 1, 1_000, 4_000, redis_allows_at_ms - MARGIN_MS - 1):
        clocks.elapsed_ms = elapsed_ms
        statuses = cache.lookup([bucket], version)
        assert statuses is not None and statuses[0].short
        # the bound it served: the recorded level plus the refill since, plus the margin
        # (the clock is a float: allow one unit of rounding)
        assert abs(statuses[0].level_units - rule.rate * (elapsed_ms + MARGIN_MS)) <= 1
        assert redis_denies([bucket], clocks.redis_ms())
    # it stops denying the margin before Redis allows (give or take the float clock's rounding)
    for elapsed_ms in (redis_allows_at_ms - MARGIN_MS + 1, redis_allows_at_ms, 60_000):
        clocks.elapsed_ms = elapsed_ms
        assert cache.lookup([bucket], version) is None
    clocks.elapsed_ms = redis_allows_at_ms
    assert not redis_denies([bucket], clocks.redis_ms())
    assert redis_denies([bucket], clocks.redis_ms() - 1)


def test_a_costlier_request_on_the_same_bucket_is_denied_until_its_cost_refills():
    clocks = Clocks()
    cache = DenyCache(clock=clocks.cache_s)
    rule = make_rule(rate=2, period_s=10, burst=3)
    version = deny_in_redis_and_remember(cache, [make_bucket(rule)], clocks)
    costly = make_bucket(rule, cost=3)
    clocks.elapsed_ms = 3 * 5_000 - MARGIN_MS - 1
    assert cache.lookup([costly], version) is not None
    assert redis_denies([costly], clocks.redis_ms())
    clocks.elapsed_ms = 3 * 5_000
    assert cache.lookup([costly], version) is None
    assert not redis_denies([costly], clocks.redis_ms())


def test_other_requests_debits_keep_the_bound_valid():
    clocks = Clocks()
    cache = DenyCache(clock=clocks.cache_s)
    rule = make_rule(rate=1, period_s=1, burst=5)
    small, big = make_bucket(rule, cost=1), make_bucket(rule, cost=5)
    take([small], now_ms=clocks.redis_ms())
    version = deny_in_redis_and_remember(cache, [big], clocks)  # 4 left, 5 needed
    clocks.elapsed_ms = 500
    assert take([small], now_ms=clocks.redis_ms())[0]  # someone else spends a token
    assert cache.lookup([big], version) is not None
    assert redis_denies([big], clocks.redis_ms())


def test_a_config_version_change_disables_entries():
    clocks = Clocks()
    cache = DenyCache(clock=clocks.cache_s)
    bucket = make_bucket(make_rule(rate=1, period_s=60, burst=1))
    version = deny_in_redis_and_remember(cache, [bucket], clocks)
    assert cache.lookup([bucket], version) is not None
    assert cache.lookup([bucket], str(int(version) + 1)) is None


def test_a_shadow_shortage_never_denies():
    clocks = Clocks()
    cache = DenyCache(clock=clocks.cache_s)
    enforced = make_bucket(make_rule(rate=1, period_s=60, burst=1), token="user.a")
    shadow = make_bucket(make_rule(rate=1, period_s=60, burst=1, shadow=True), token="ip.a")
    version = deny_in_redis_and_remember(cache, [enforced, shadow], clocks)
    assert cache.lookup([enforced, shadow], version) is not None
    # another caller behind the same IP: only the shadow bucket is known to be short
    fresh = make_bucket(make_rule(rate=1, period_s=60, burst=1), token="user.b")
    assert cache.lookup([fresh, shadow], version) is None
    assert cache.lookup([shadow], version) is None
    assert take([fresh, shadow], now_ms=clocks.redis_ms())[0]


def test_size_stays_within_max_entries_and_the_newest_denial_is_kept():
    clocks = Clocks()
    cache = DenyCache(max_entries=5, clock=clocks.cache_s)
    rng = random.Random(7)
    for i in range(40):
        rules = [make_rule(rate=1, period_s=3600, burst=1) for _ in range(rng.randint(1, 3))]
        buckets = [make_bucket(r, token=f"ip.{i}") for r in rules]
        version = deny_in_redis_and_remember(cache, buckets, clocks)
        assert len(cache) <= 5
        assert cache.lookup(buckets, version) is not None


def test_entries_of_refilled_buckets_are_dropped_first():
    clocks = Clocks()
    cache = DenyCache(max_entries=3, clock=clocks.cache_s)
    quick = make_bucket(make_rule(rate=1, period_s=1, burst=1), token="ip.quick")
    slow = [make_bucket(make_rule(rate=1, period_s=3600, burst=1), token=f"ip.s{i}")
            for i in range(3)]
    version = deny_in_redis_and_remember(cache, [quick], clocks)
    for bucket in slow[:2]:
        deny_in_redis_and_remember(cache, [bucket], clocks)
    clocks.elapsed_ms = 2_000  # "quick" is full again; the slow ones are still empty
    deny_in_redis_and_remember(cache, [slow[2]], clocks)
    assert len(cache) == 3
    assert all(cache.lookup([b], version) is not None for b in slow)


def test_no_deny_cache_when_the_setting_is_off(settings, db):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "LOCAL_DENY_CACHE": False}
    assert limiter().deny_cache is None
    load_demo_data()
    limiter().policies.reset()
    decisions = [decide(RequestFactory().get("/api/items/", REMOTE_ADDR="192.0.2.9"), None,
                        "api:items") for _ in range(45)]  # free-ip holds 40
    assert not decisions[-1].allowed
    assert not any(d.from_deny_cache for d in decisions)


def test_random_rules_costs_and_timings_never_deny_what_redis_allows(redis_client):
    """Property: whenever the cache denies at clock reading c, the script run (without
    debiting) at any Redis time from c's mapping to c's mapping + the safety margin denies too."""
    rng = random.Random(20261122)
    cached_denials = 0
    for trial in range(150):
        clocks = Clocks()
        cache = DenyCache(clock=clocks.cache_s)
        rules = [make_rule(rate=rng.randint(1, 50), period_s=rng.choice([1, 2, 7, 60, 3600]),
                           burst=rng.randint(1, 20), shadow=i > 0 and rng.random() < 0.3)
                 for i in range(rng.randint(1, 3))]
        keys = [make_bucket(r, token=f"ip.{trial}.{i}").key for i, r in enumerate(rules)]
        for _ in range(60):
            clocks.elapsed_ms += rng.choice([0, 0, 1, 5, 37, 250, 1_000, 9_000])
            cost = rng.randint(1, 8)
            # requests touch all the buckets or only some (other endpoints, other callers)
            chosen = [i for i in range(len(rules)) if i == 0 or rng.random() < 0.7]
            buckets = [Bucket(rules[i], keys[i], cost) for i in chosen]
            if cache.lookup(buckets, "0") is not None:
                cached_denials += 1
                late_ms = rng.randint(0, MARGIN_MS - 1)  # strictly inside the margin
                assert redis_denies(buckets, clocks.redis_ms() + late_ms), (trial, buckets)
                continue
            # the request goes to Redis; the call may leave up to 3 ms before Redis runs it
            sent_at = clocks.cache_s() - rng.randint(0, 3) / 1000
            allowed, statuses, version = take(buckets, now_ms=clocks.redis_ms())
            assert version == "0"
            # Key TTLs run in real time, which here is not the script's time: keep the keys
            # (a key read after it would have expired holds a full bucket, as the TTL assumes)
            for key in keys:
                redis_client.persist(key)
            if not allowed:
                cache.remember(buckets, statuses, version, sent_at)
        redis_client.flushall()
    assert cached_denials > 500  # the property was exercised, not vacuously true


# --- through the engine and the middleware ---------------------------------------------------

def test_a_denial_reported_with_a_newer_config_version_is_not_reused_under_new_rules(
        settings, db, monkeypatch):
    # The denial was computed with the old rules (a token per 10 s, period 10 s); Redis already
    # reports the new version (the same speed with a 10 h period, so 3600 times the units per
    # token). The old levels must not bound the new rules.
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_CHECK_INTERVAL_S": 3600}
    plan = Plan.objects.create(slug="p", name="P", default_for_anonymous=True)
    rule = Rule.objects.create(name="ip", plan=plan, scope=Scope.IP, rate=1, period_s=10, burst=2)
    use_fake_clock(monkeypatch)
    factory = RequestFactory()

    def request(cost):
        return decide(factory.get("/hello/", HTTP_X_REQUEST_COST=str(cost)),
                                    None, "hello")

    assert request(1).allowed                        # 1 token left
    Rule.objects.filter(pk=rule.pk).update(rate=3600, period_s=36_000)
    limiter().bump_config_version()                    # as the commit hook does
    assert not request(2).allowed                    # old rules, new version in the reply
    decision = request(1)                            # reloaded: still 1 token (rescaled)
    assert not decision.from_deny_cache
    assert decision.allowed


def total_commands(redis_server):
    """Commands the server has executed, from INFO commandstats (INFO itself excluded)."""
    stats = redis_server.client().info("commandstats")
    return sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")


def test_a_client_hammering_while_denied_barely_touches_redis(db, redis_server):
    load_demo_data()
    client = Client()
    assert [client.get("/hello/").status_code for _ in range(40)] == [200] * 40
    # the 40th call emptied free-ip: the cache learnt that from Redis's (allowed) reply
    first_denial = client.get("/hello/")
    assert first_denial.status_code == 429
    before = total_commands(redis_server)
    denied = [client.get("/hello/") for _ in range(300)]
    commands = total_commands(redis_server) - before
    assert all(r.status_code == 429 and "RateLimit" in r for r in denied)
    assert all(r.wsgi_request.ratelimit.from_deny_cache for r in denied)
    assert commands / len(denied) <= 0.1, commands


def test_an_allowed_reply_that_empties_a_bucket_is_remembered():
    clocks = Clocks()
    cache = DenyCache(clock=clocks.cache_s)
    bucket = make_bucket(make_rule(rate=1, period_s=10, burst=2))
    for expected_entries in (0, 1):  # 2 tokens: the second call leaves the bucket empty
        sent_at = clocks.cache_s()
        allowed, statuses, version = take([bucket], now_ms=clocks.redis_ms())
        assert allowed
        cache.learn([bucket], statuses, allowed, version, sent_at)
        assert len(cache) == expected_entries
    assert cache.lookup([bucket], version) is not None      # answered locally ...
    assert redis_denies([bucket], clocks.redis_ms())        # ... as Redis would
    clocks.elapsed_ms = 10_000 - MARGIN_MS + 1  # the token may be due by arrival: ask Redis
    assert cache.lookup([bucket], version) is None
    assert not redis_denies([bucket], clocks.redis_ms() + MARGIN_MS)


def test_an_allowed_reply_with_tokens_left_is_not_remembered():
    clocks = Clocks()
    cache = DenyCache(clock=clocks.cache_s)
    enforced = make_bucket(make_rule(rate=1, period_s=10, burst=5), token="a")
    shadow = make_bucket(make_rule(rate=1, period_s=10, burst=1, shadow=True), token="b")
    allowed, statuses, version = take([enforced, shadow], now_ms=clocks.redis_ms())
    cache.learn([enforced, shadow], statuses, allowed, version, clocks.cache_s())
    assert allowed and len(cache) == 0  # an empty shadow bucket never makes a denial
