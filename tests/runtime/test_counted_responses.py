"""Rules that count responses (issue 50 §2): only responses with a status in a set, or under a
path prefix, cost a token, charged after the response through the settle path; a caller with
none left is refused on its way in; the requests they do not match cost them nothing."""

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from ratelimit_app.models import EndpointCost, Rule, Scope

from ..helpers import limiter, load_demo_data, use_fake_clock

pytestmark = pytest.mark.django_db

BURST = 4


@pytest.fixture
def demo():
    load_demo_data()
    use_fake_clock()  # no refill during a test


def rule(**fields):
    made = Rule.objects.create(name="scraper-404s", scope=Scope.IP, rate=1, period_s=3600,
                               burst=BURST, **fields)
    limiter().policies.reset()
    return made


def test_only_the_counted_statuses_spend_the_bucket(demo, redis_server):
    rule(counted_statuses="404")
    client = Client()
    assert client.get("/hello/").status_code == 200  # (the script loaded)
    settles = redis_server.command_calls("evalsha")
    for _ in range(10):  # 200s: not counted, and no settle sent for them
        assert client.get("/hello/").status_code == 200
    takes = 10  # one take.lua call each, nothing more
    assert redis_server.command_calls("evalsha") - settles == takes
    for i in range(BURST):
        assert client.get(f"/missing-{i}/").status_code == 404
    refused = client.get("/hello/")  # out of 404s: refused, whatever it asks for now
    assert refused.status_code == 429
    assert "scraper-404s" in refused["RateLimit-Policy"]
    # another address is not affected
    assert Client(REMOTE_ADDR="198.51.100.8").get("/hello/").status_code == 200


def test_a_path_prefix_counts_segments(demo):
    rule(counted_path_prefix="/api")
    client = Client()
    for _ in range(BURST + 2):
        assert client.get("/hello/").status_code == 200  # not under /api
    for _ in range(BURST):
        client.get("/api/items/")
    assert client.get("/hello/").status_code == 429


def test_a_shadow_rule_counts_and_refuses_no_one(demo):
    rule(counted_statuses="4xx", mode="shadow")
    client = Client()
    for i in range(BURST + 3):
        client.get(f"/missing-{i}/")
    assert client.get("/hello/").status_code == 200


def test_counting_responses_is_for_token_buckets_counting_requests(db):
    made = Rule(name="x", scope=Scope.IP, rate=1, period_s=60, burst=5, counted_statuses="40x")
    with pytest.raises(ValidationError) as error:
        made.full_clean()
    assert "counted_statuses" in error.value.message_dict
    made.counted_statuses, made.counted_path_prefix = "404", "login"
    with pytest.raises(ValidationError) as error:
        made.full_clean()
    assert "counted_path_prefix" in error.value.message_dict


def test_a_limit_on_responses_may_have_a_burst_below_an_endpoints_cost(demo):
    # "5 failed logins a minute" on a plan whose reports cost 20 tokens: each counted response
    # costs one token, so the rule is valid and a report passes it
    failed_logins = Rule(name="failed-logins", plan=Rule.objects.get(name="free-ip").plan,
                         scope=Scope.IP, rate=5, period_s=60, burst=5, counted_statuses="401")
    failed_logins.full_clean()
    failed_logins.save()
    limiter().policies.reset()
    client = Client()
    assert client.post("/api/reports/").status_code == 202
    # and no endpoint cost is refused because of it
    EndpointCost(endpoint="api:reports", method="PUT", cost=25).full_clean()
