"""The usage endpoint (views/usage.py): a client's own quotas as JSON, read without spending
them."""

import datetime
import json

import http_sfv
import pytest
from django.test import Client
from django.urls import include, path, reverse
from rest_framework import routers
from rest_framework.reverse import reverse as drf_reverse

from ratelimit_app.decision.headers import BANNED
from ratelimit_app.models import (
    AccessListEntry,
    ApiKey,
    BanRule,
    IdentityOverride,
    Kind,
    Plan,
    Rule,
)
from ratelimit_app.views import usage
from ratelimit_app.views.usage import ANSWER_TTL_S, usage_view

from ..helpers import limiter, load_demo_data, use_fake_clock

USAGE_URL = "/ratelimit/usage/"
BOB = {"HTTP_X_API_KEY": "rk_bob_pro"}
CAROL = {"HTTP_X_API_KEY": "rk_carol_enterprise"}


# A project whose DRF API root links the usage endpoint (the example in docs/reference/usage.md).
class ApiRoot(routers.APIRootView):
    def get(self, request, *args, **kwargs):
        response = super().get(request, *args, **kwargs)
        response.data["rate_limit"] = drf_reverse("rate-limit", request=request)
        return response


router = routers.DefaultRouter()
router.APIRootView = ApiRoot
urlpatterns = [
    path("api/", include(router.urls)),
    path("api/rate_limit/", usage_view, name="rate-limit"),
]


@pytest.fixture
def demo(db):
    load_demo_data()


@pytest.fixture
def clock():
    return use_fake_clock()


def alice_client():
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.get(username="alice"))
    return client


def usage_of(client, **headers):
    response = client.get(USAGE_URL, **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    assert response["Cache-Control"] == "no-store"
    assert "RateLimit-Policy" not in response  # not limited, so no headers either
    return response.json()


def by_name(body):
    return {p["name"]: p for p in body["policies"]}


def header_items(response, header):
    """Return {name: params} of a RateLimit or RateLimit-Policy header."""
    parsed = http_sfv.List()
    parsed.parse(response[header].encode("ascii"))
    return {item.value: dict(item.params) for item in parsed}


def bucket_values(redis_client):
    return {key: redis_client.get(key) for key in redis_client.keys("*")}


def test_the_demo_mounts_it_under_ratelimit():
    assert reverse("ratelimit_app:usage") == USAGE_URL


@pytest.mark.parametrize("caller, kind, plan", [
    ("bob", "key", "pro"), ("carol", "key", "enterprise"), ("alice", "user", "free"),
    ("anonymous", "anonymous", "free")])
def test_it_says_what_the_headers_of_a_real_request_say(demo, clock, caller, kind, plan):
    client = alice_client() if caller == "alice" else Client()
    headers = {"bob": BOB, "carol": CAROL}.get(caller, {})
    real = client.get("/api/search/", **headers)  # cost 5: the levels differ from full
    assert real.status_code == 200
    body = usage_of(client, **headers)
    assert (body["identified_by"], body["plan"], body["exempt"]) == (kind, plan, False)
    policies = by_name(body)
    limits = header_items(real, "RateLimit-Policy")
    levels = header_items(real, "RateLimit")
    # every policy of the request, plus the caller's endpoint rules (alice's free-reports)
    assert set(limits) == {name for name, p in policies.items()
                           if p["endpoint"] in (None, "api:search")}
    now = datetime.datetime.fromtimestamp(clock.seconds(), datetime.timezone.utc)
    for name, params in limits.items():
        policy = policies[name]
        assert (policy["limit"], policy["window"]) == (params["q"], params["w"])
        assert policy["shared"] == (name not in levels)
        if name in levels:
            assert (policy["remaining"], policy["reset"]) == (levels[name]["r"], levels[name]["t"])
            reset_at = now + datetime.timedelta(seconds=policy["reset"])
            assert policy["reset_at"] == reset_at.isoformat(timespec="seconds")
        else:
            assert not {"remaining", "reset", "reset_at"} & set(policy)


def test_a_full_bucket_reports_when_a_spent_token_is_back_in_usage_and_headers(demo, clock):
    """r = q is not "reset 0": draft-11's t (usage's reset) is the seconds until more quota is
    made available, and a full bucket's next token comes one token-time after a spend
    (free-ip: 20 per 60 s, 3 s), in the headers and the usage endpoint alike."""
    client = Client()
    fresh = by_name(usage_of(client))["free-ip"]
    assert (fresh["limit"], fresh["window"], fresh["remaining"], fresh["reset"]) == \
        (40, 120, 40, 3)
    response = client.get("/api/items/")
    assert header_items(response, "RateLimit")["free-ip"] == {"r": 39, "t": 3}
    clock.advance(120_000)  # refilled: full again
    refilled = by_name(usage_of(client))["free-ip"]
    assert (refilled["remaining"], refilled["reset"]) == (40, 3)
    now = datetime.datetime.fromtimestamp(clock.seconds(), datetime.timezone.utc)
    assert refilled["reset_at"] == (now + datetime.timedelta(seconds=3)).isoformat(
        timespec="seconds")


def test_an_idle_concurrency_limit_reports_reset_1_and_no_window(demo, clock):
    Rule.objects.create(name="inflight", plan=Plan.objects.get(slug="free"), scope="ip",
                        kind=Kind.CONCURRENCY, rate=3, period_s=30, burst=3)
    limiter().policies.reset()  # (the commit hook that would do it does not run in a test)
    client = Client()
    idle = by_name(usage_of(client))["inflight"]
    assert (idle["limit"], idle["window"], idle["remaining"], idle["reset"]) == (3, None, 3, 1)
    response = client.get("/api/items/")  # holds a slot while it is served
    assert header_items(response, "RateLimit")["inflight"] == {"r": 2, "t": 1}
    assert "w" not in header_items(response, "RateLimit-Policy")["inflight"]
    clock.advance(int(ANSWER_TTL_S * 1000))  # a new reading, after the slot was released
    assert by_name(usage_of(client))["inflight"]["remaining"] == 3


def test_endpoint_rules_are_listed_with_their_endpoint(demo, clock):
    reports = by_name(usage_of(alice_client()))["free-reports"]
    assert (reports["endpoint"], reports["scope"], reports["limit"]) == ("api:reports", "user", 5)
    assert reports["remaining"] == 5
    # shadow rules and the failed-auth safeguard are never shown, as in the headers
    assert not {"search-ip-trial", "auth-failures"} & set(by_name(usage_of(Client())))


def test_shared_remaining_follows_the_disclosure_setting(settings, demo, clock):
    policies = by_name(usage_of(Client(), **CAROL))
    for name in ("global", "enterprise-tenant"):
        assert policies[name]["shared"] and "remaining" not in policies[name]
    assert policies["enterprise-tenant"]["limit"] == 3000
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "DISCLOSE_SHARED_REMAINING": True}
    policies = by_name(usage_of(Client(), **CAROL))
    assert policies["global"]["remaining"] == 1000
    assert policies["enterprise-tenant"]["remaining"] == 3000


def test_the_view_is_not_charged(demo, clock):
    client = Client()
    assert header_items(client.get("/api/items/", **BOB), "RateLimit")["pro-user"]["r"] == 199
    for _ in range(20):
        assert by_name(usage_of(client, **BOB))["pro-user"]["remaining"] == 199
    # the next real request is charged its own token only
    assert header_items(client.get("/api/items/", **BOB), "RateLimit")["pro-user"]["r"] == 198


def test_reading_writes_nothing(demo, clock, redis_server, redis_client):
    client = Client()
    sets = redis_server.command_calls("set")
    client.get("/api/items/", **BOB)
    assert redis_server.command_calls("set") > sets  # (the count sees the script's writes)
    before = bucket_values(redis_client)
    reads_before = redis_server.command_calls("evalsha")
    sets_before = redis_server.command_calls("set")  # take.lua writes a bucket with SET
    for _ in range(20):
        usage_of(client, **BOB)
        clock.advance(ANSWER_TTL_S * 1000)  # past the kept answer: each call reads Redis
    assert redis_server.command_calls("evalsha") - reads_before == 20
    assert redis_server.command_calls("set") == sets_before
    # (keys may expire meanwhile: their TTLs are the fake clock's refill times)
    after = bucket_values(redis_client)
    assert after.items() <= before.items()


def test_one_caller_asking_often_costs_one_read_a_second(demo, clock, redis_server):
    client = Client()
    reads_before = redis_server.command_calls("evalsha")
    for _ in range(50):
        usage_of(client, **BOB)
    assert redis_server.command_calls("evalsha") - reads_before == 1
    clock.advance(ANSWER_TTL_S * 1000)
    usage_of(client, **BOB)
    assert redis_server.command_calls("evalsha") - reads_before == 2


def test_many_callers_cost_at_most_the_reads_budget(monkeypatch, demo, clock, redis_server):
    monkeypatch.setattr(usage, "READS_PER_S", 5)
    client = Client()
    reads_before = redis_server.command_calls("evalsha")
    responses = [client.get(USAGE_URL, REMOTE_ADDR=f"10.0.0.{i}") for i in range(1, 21)]
    assert redis_server.command_calls("evalsha") - reads_before == 5
    assert [r.status_code for r in responses] == [200] * 5 + [503] * 15
    busy = responses[-1]
    assert (busy["Retry-After"], busy["Cache-Control"]) == ("1", "no-store")
    assert json.loads(busy.content)["title"] == "Usage lookups busy"
    # the callers answered already keep their answer; the next second has a new budget
    assert client.get(USAGE_URL, REMOTE_ADDR="10.0.0.1").status_code == 200
    clock.advance(1000)
    assert client.get(USAGE_URL, REMOTE_ADDR="10.0.0.20").status_code == 200
    assert redis_server.command_calls("evalsha") - reads_before == 6


def test_a_flood_from_fresh_addresses_leaves_callers_with_credentials_their_share(
        monkeypatch, demo, clock, redis_server):
    """Addresses cost nothing to make up: anonymous callers spend at most
    ANONYMOUS_READS_PER_S of a worker's reads, and bob (an API key) still reads his."""
    monkeypatch.setattr(usage, "READS_PER_S", 10)
    monkeypatch.setattr(usage, "ANONYMOUS_READS_PER_S", 3, raising=False)
    client = Client()
    reads_before = redis_server.command_calls("evalsha")
    bob_statuses, flood_answered = [], []
    for second in range(6):
        flood = [client.get(USAGE_URL, REMOTE_ADDR=f"10.{second}.{i // 250}.{i % 250}")
                 for i in range(300)]
        flood_answered.append([r.status_code for r in flood].count(200))
        bob_statuses.append(client.get(USAGE_URL, **BOB).status_code)
        clock.advance(1000)
    assert bob_statuses == [200] * 6
    assert flood_answered == [3] * 6  # the anonymous share, each second
    assert redis_server.command_calls("evalsha") - reads_before == 6 * (3 + 1)


def test_callers_with_credentials_share_the_whole_budget(monkeypatch, demo, clock,
                                                         redis_server):
    monkeypatch.setattr(usage, "READS_PER_S", 2)
    monkeypatch.setattr(usage, "ANONYMOUS_READS_PER_S", 1, raising=False)
    reads_before = redis_server.command_calls("evalsha")
    assert Client().get(USAGE_URL, REMOTE_ADDR="10.0.0.1").status_code == 200
    assert Client().get(USAGE_URL, REMOTE_ADDR="10.0.0.2").status_code == 503  # its share
    assert Client().get(USAGE_URL, **BOB).status_code == 200
    # the anonymous share is part of the budget, never added to it
    assert alice_client().get(USAGE_URL).status_code == 503
    assert redis_server.command_calls("evalsha") - reads_before == 2


def test_kept_answers_are_bounded(monkeypatch, demo, clock, redis_server):
    monkeypatch.setattr(usage, "MAX_ANSWERS", 3)
    client = Client()
    for i in range(1, 5):  # the fourth caller pushes out the first
        usage_of(client, REMOTE_ADDR=f"10.0.0.{i}")
    reads_before = redis_server.command_calls("evalsha")
    usage_of(client, REMOTE_ADDR="10.0.0.4")
    assert redis_server.command_calls("evalsha") == reads_before
    usage_of(client, REMOTE_ADDR="10.0.0.1")
    assert redis_server.command_calls("evalsha") == reads_before + 1


def test_an_exempt_caller_reads_nothing(demo, clock, redis_server):
    IdentityOverride.objects.create(api_key=ApiKey.objects.get(user__username="bob"), exempt=True)
    reads_before = redis_server.command_calls("evalsha")
    body = usage_of(Client(), **BOB)
    assert (body["exempt"], body["policies"]) == (True, [])
    assert redis_server.command_calls("evalsha") == reads_before


def test_a_denied_caller_is_told_it_is_denied_as_its_requests_are(demo, clock, redis_server):
    AccessListEntry.objects.create(kind="deny", target="ip", value="203.0.113.0/24",
                                   reason="abuse: write to abuse@example.com")
    AccessListEntry.objects.create(kind="allow", target="ip", value="198.51.100.7", exempt=True,
                                   reason="our monitoring")
    limiter().policies.reset()
    client = Client(REMOTE_ADDR="203.0.113.9")
    api = client.get("/api/items/", **BOB)
    reads_before = redis_server.command_calls("evalsha")
    usage_answer = client.get(USAGE_URL, **BOB)
    assert redis_server.command_calls("evalsha") == reads_before  # nothing read
    assert (usage_answer.status_code, api.status_code) == (403, 403)
    assert usage_answer["Content-Type"] == "application/problem+json"
    assert usage_answer["Cache-Control"] == "no-store"
    assert json.loads(usage_answer.content) == json.loads(api.content)
    assert json.loads(usage_answer.content)["reason"] == "abuse: write to abuse@example.com"
    # an exempt allow entry: exempt, as its requests are
    body = usage_of(Client(REMOTE_ADDR="198.51.100.7"))
    assert (body["exempt"], body["policies"]) == (True, [])


def test_a_banned_caller_is_told_it_is_banned(demo, clock):
    BanRule.objects.create(name="scrapers", scope="ip", events="statuses", statuses="404",
                           threshold=3, window_s=60, ban_s=600)
    limiter().policies.reset()
    client = Client()
    for i in range(3):
        assert client.get(f"/no-such-page-{i}/").status_code == 404
    api = client.get("/api/items/", **BOB)
    answer = client.get(USAGE_URL, **BOB)
    assert (answer.status_code, api.status_code) == (429, 429)
    body = json.loads(answer.content)
    assert (body["type"], body["banned-by"]) == (BANNED, ["scrapers"])
    assert answer["Retry-After"] == api["Retry-After"] == "600"


def test_guessed_api_keys_are_charged_and_a_right_guess_looks_like_a_wrong_one(demo, clock):
    client = Client()
    for i in range(10):  # auth-failures: ten tries
        body = usage_of(client, HTTP_X_API_KEY=f"rk_guess_{i}")
        assert body["identified_by"] == "anonymous"  # limited as anonymous, like the limiter
    wrong = client.get(USAGE_URL, HTTP_X_API_KEY="rk_guess_again")
    right = client.get(USAGE_URL, **BOB)
    without = client.get(USAGE_URL)
    assert json.loads(right.content)["violated-policies"] == ["auth-failures"]
    for response in (wrong, right, without):  # the same answer, whatever the IP sends
        assert response.status_code == 429
        assert (response.content, response["RateLimit"], response["Retry-After"]) == \
            (right.content, right["RateLimit"], right["Retry-After"])


def test_redis_down_is_a_503_with_a_json_body(demo, redis_server):
    redis_server.kill()
    client = Client()
    for _ in range(5):  # through the breaker opening: never a 500
        response = client.get(USAGE_URL, **BOB)
        assert response.status_code == 503
        assert response["Content-Type"] == "application/problem+json"
        assert response["Cache-Control"] == "no-store"
        assert int(response["Retry-After"]) >= 1
        problem = json.loads(response.content)
        assert problem["status"] == 503
        assert "cannot reach its store" in problem["detail"]


def test_only_safe_methods(demo, clock):
    assert Client().post(USAGE_URL).status_code == 405


@pytest.mark.urls("tests.views.test_usage")
def test_a_drf_api_root_links_it_and_drf_never_throttles_it(demo, clock):
    client = Client()
    root = client.get("/api/", **BOB)  # a DRF view: charged by QuotaThrottle
    assert root.status_code == 200
    assert root.json()["rate_limit"] == "http://testserver/api/rate_limit/"
    assert header_items(root, "RateLimit")["pro-user"]["r"] == 199
    response = client.get("/api/rate_limit/", **BOB)
    assert response.status_code == 200 and "RateLimit" not in response
    assert by_name(response.json())["pro-user"]["remaining"] == 199
    assert header_items(client.get("/api/", **BOB), "RateLimit")["pro-user"]["r"] == 198


def test_a_credit_balance_shows_its_units_left_and_last_top_up(db, clock):
    from django.contrib.auth import get_user_model
    from django.test import TestCase

    from ratelimit_app.business.credits.ledger import client_of, top_up

    plan = Plan.objects.create(slug="prepaid", name="Prepaid", default_for_authenticated=True)
    rule = Rule(name="credits", plan=plan, scope="user", kind=Kind.CREDITS, rate=3,
                calendar_period="day")
    rule.full_clean()
    rule.save()
    api_key, raw = ApiKey.create_key(get_user_model().objects.create_user("payer"), "billing",
                                     plan=plan)
    with TestCase.captureOnCommitCallbacks(execute=True):
        top_up(f"key:{api_key.pk}", 20, "payment-1", actor="test",
               client=client_of(limiter().store))
    [policy] = usage_of(Client(), HTTP_X_API_KEY=raw)["policies"]
    # the balance read (seeded from the ledger on this first look): allowance 3 + 20 prepaid
    assert policy["name"] == "credits" and policy["remaining"] == 23 and policy["window"] is None
    assert policy["credits"]["units_left"] == 23
    assert policy["credits"]["allowance_period"] == "day"
    assert policy["credits"]["last_top_up"]["units"] == 20
