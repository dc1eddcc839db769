"""An allowed decision that no bucket was short for carries its reply's levels (a LevelStatuses)
rather than a PolicyStatus per bucket: the headers, the metrics and the deny cache read the
levels, and the statuses are built only if something else reads them. Everything they produce
must be what the statuses would have given, whatever the scopes, shadow rules, costs, levels
and DISCLOSE_SHARED_REMAINING."""

import itertools
import time

import pytest
from django.contrib.auth.models import AnonymousUser
from django.http import HttpResponse
from django.test import RequestFactory

from ratelimit_app.config.snapshot import CompiledRule
from ratelimit_app.decision import engine
from ratelimit_app.decision.buckets import Bucket, LevelStatuses
from ratelimit_app.decision.deny_cache import DenyCache
from ratelimit_app.decision.headers import apply_headers
from ratelimit_app.decision.identity import Identity
from ratelimit_app.metrics.recorder import Recorder
from ratelimit_app.models import Plan, Rule, Scope
from ratelimit_app.runtime import guard
from ratelimit_app.stores.base import TakeReply

from ..helpers import limiter

IDENTITY = Identity("user", "alice", "192.0.2.7", "pro", None, "42", None)


def rule(rule_id, scope, *, rate=10, period_s=60, burst=20, shadow=False, endpoint=""):
    return CompiledRule(id=rule_id, name=f"r{rule_id}-{scope}", scope=scope, plan="pro",
                        endpoint=endpoint, rate=rate, period_s=period_s, burst=burst,
                        shadow=shadow, fail_open=None)


def planned(cost=3):
    """Buckets of every kind a plain plan has: shared (global, plan), own (user, ip), a shadow
    one, an endpoint rule (1 token), odd rates and periods (remainders in every division)."""
    return engine.PlannedBuckets([
        Bucket(rule(1, "global", rate=1000, period_s=1, burst=2000), "rl:{global}", cost),
        Bucket(rule(2, "plan", rate=7, period_s=13, burst=50), "rl:{plan.pro}", cost),
        Bucket(rule(3, "user", rate=3, period_s=7, burst=11), "rl:{user.abc}", cost),
        Bucket(rule(4, "ip", rate=5, period_s=60, burst=9, shadow=True), "rl:{ip.def}", cost),
        Bucket(rule(5, "ip", rate=2, period_s=3600, burst=40, endpoint="search"),
               "rl:{ip.def}", 1),
    ])


def level_sets(buckets):
    """Levels after an allowed debit: full, nearly empty (under 20 %: near-limit), exactly one
    token, and a fraction past whole tokens, per bucket, in a few combinations."""
    def choices(bucket):
        one = bucket.period_ms
        return [bucket.capacity_units - bucket.cost_units, bucket.cost_units,
                bucket.cost_units + one // 3 + 1, one * (bucket.rule.burst // 6) + 7]
    per_bucket = [choices(bucket) for bucket in buckets]
    combinations = itertools.product(*per_bucket)
    return [list(levels) for levels in itertools.islice(combinations, 0, None, 37)]


def both_ways(buckets, levels):
    """The Decision of one reply read as levels, and as statuses (what it was before)."""
    reply = TakeReply(True, "v1", levels, [1] * len(levels))
    lazy = engine.reply_statuses(buckets, reply)
    built = engine.statuses_from(buckets, reply)
    assert type(lazy) is LevelStatuses and type(built) is tuple
    return [engine.decision_from(buckets, statuses, True, IDENTITY, "search", buckets[0].cost)
            for statuses in (lazy, built)]


def fields(decision):
    response = HttpResponse()
    apply_headers(response, decision)
    return {name: response.get(name) for name in ("RateLimit-Policy", "RateLimit", "Retry-After")}


def counted(decision, now):
    recorder = Recorder(clock=lambda: now)
    recorder._count(now, decision)
    (minute,) = recorder._minutes.values()
    return (dict(minute.counts), dict(minute.usage), dict(minute.near),
            minute.by_tokens.entries, minute.by_denials.entries)


@pytest.mark.parametrize("disclose", [False, True])
def test_headers_metrics_and_the_deny_cache_read_levels_as_they_read_statuses(settings,
                                                                                disclose):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "DISCLOSE_SHARED_REMAINING": disclose}
    now = time.time()
    buckets = planned()
    cases = level_sets(buckets)
    assert len(cases) >= 20
    near_limit_seen = False
    for levels in cases:
        lazy, built = both_ways(buckets, levels)
        assert fields(lazy) == fields(built)
        assert fields(lazy)["RateLimit"]  # own buckets are shown
        lazy_counts, built_counts = counted(lazy, now), counted(built, now)
        assert lazy_counts == built_counts
        near_limit_seen = near_limit_seen or bool(lazy_counts[2])
        caches = [DenyCache(clock=lambda: 100.0) for _ in range(2)]
        for cache, decision in zip(caches, (lazy, built)):
            cache.learn(buckets, decision.policies, True, "v1", 99.0)
        assert caches[0]._entries == caches[1]._entries
        # and read as statuses, the levels are the statuses
        assert lazy == built and hash(lazy) == hash(built)
        assert list(lazy.policies) == list(built.policies) and len(lazy.policies) == 5
        assert lazy.policies[2] == built.policies[2] and repr(lazy.policies) == repr(
            built.policies)
    assert near_limit_seen  # the near-limit table was exercised, not only skipped


def test_a_bucket_short_or_a_denial_reads_statuses():
    buckets = planned()
    levels = [b.capacity_units for b in buckets]
    short_shadow = TakeReply(True, "v1", levels, [1, 1, 1, -1, 1])
    denied = TakeReply(False, "v1", levels, [1, 1, -1, 1, 1])
    assert type(engine.reply_statuses(buckets, short_shadow)) is tuple
    assert type(engine.reply_statuses(buckets, denied)) is tuple


def test_only_plain_buckets_without_a_gate_are_read_as_levels():
    gate = Bucket(CompiledRule(id=9, name="auth", scope="ip", plan=None, endpoint="", rate=1,
                               period_s=60, burst=10, shadow=False, fail_open=None,
                               failed_auth=True), "rl:{ip.def}", 1, gate=True)
    with_gate = engine.PlannedBuckets([*planned(), gate])
    levels = [b.capacity_units for b in with_gate]
    reply = TakeReply(True, "v1", levels, [1, 1, 1, 1, 1, 0])
    assert not with_gate.plain and planned().plain
    assert type(engine.reply_statuses(with_gate, reply)) is tuple


@pytest.mark.django_db
def test_a_request_through_the_limiter_headers_and_metrics_builds_no_status(monkeypatch):
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    # (refills slow enough that no whole token comes back while the test runs)
    Rule.objects.create(name="everyone", plan=None, scope=Scope.GLOBAL, rate=1000,
                        period_s=3600, burst=1000)
    Rule.objects.create(name="free-ip", plan=plan, scope=Scope.IP, rate=10, period_s=60,
                        burst=20)
    built = []
    status = Bucket.status
    monkeypatch.setattr(Bucket, "status", lambda self, level, short: built.append(self) or
                        status(self, level, short))

    def request_through():
        request = RequestFactory().get("/", REMOTE_ADDR="192.0.2.50")
        decision = guard.decide(request, AnonymousUser())
        response = apply_headers(HttpResponse(), decision)
        limiter().recorder.counts()  # counts what is queued
        return request, decision, response

    request_through()  # the first one works out the headers' parts of its buckets, once
    built.clear()
    request, decision, response = request_through()
    assert decision.allowed and type(decision.policies) is LevelStatuses
    assert response["RateLimit"] == '"free-ip";r=18;t=6'
    assert response["RateLimit-Policy"] == '"everyone";q=1000;w=3600, "free-ip";q=20;w=120'
    assert built == []
    # read by anything else, the statuses are there, built once
    assert [p.remaining for p in request.ratelimit.policies] == [998, 18]
    assert len(built) == 2 and request.ratelimit.policies[1].name == "free-ip"
    assert len(built) == 2
