"""The penalty box (issue 50 §1): N events within W ban the caller for D, escalating; the ban is
checked in the decision's own take.lua call, ends on time, and is lifted; bans and lifts are
logged in the ban log (issue 56), not in the audit trail."""

import json

import pytest
from django.test import Client

from ratelimit_app.config.ban_records import current_bans
from ratelimit_app.config.audit import Actor
from ratelimit_app.decision.headers import BANNED
from ratelimit_app.models import (AuditEntry, Ban, BanLogEntry, BanRule, Plan, Rule, Scope,
                                  WebhookDelivery, WebhookEndpoint)

from ..helpers import limiter, load_demo_data, use_fake_clock

pytestmark = pytest.mark.django_db

THRESHOLD, BAN_S = 5, 600


@pytest.fixture
def scraper_rule():
    load_demo_data()
    rule = BanRule.objects.create(name="scrapers", scope="ip", events="statuses",
                                  statuses="404", threshold=THRESHOLD, window_s=60,
                                  ban_s=BAN_S, factor=2, max_ban_s=3 * BAN_S, memory_s=86400)
    clock = use_fake_clock()
    limiter().policies.reset()
    return rule, clock


def banned(response):
    assert response.status_code == 429, response.content
    body = json.loads(response.content)
    assert body["type"] == BANNED
    return body


def write_ban_log():
    """What the ban log's thread does (off in unit tests): write the bans noted so far."""
    return limiter().protection.ban_log.drain()


def walk_404s(client, count, start=0):
    for i in range(start, start + count):
        assert client.get(f"/no-such-page-{i}/").status_code == 404


def test_a_scraper_walking_404s_is_banned_after_exactly_n(scraper_rule):
    audited = AuditEntry.objects.count()  # the rule's creation
    client = Client()
    walk_404s(client, THRESHOLD - 1)
    assert client.get("/hello/").status_code == 200  # N - 1: not yet
    walk_404s(client, 1, start=100)                  # the Nth
    body = banned(client.get("/hello/"))
    assert body["banned-by"] == ["scrapers"]
    refused = client.get("/hello/")
    assert refused["Retry-After"] == str(BAN_S)
    assert "scrapers" in refused["RateLimit-Policy"]
    # another address is not affected
    assert Client(REMOTE_ADDR="198.51.100.3").get("/hello/").status_code == 200
    assert not Ban.objects.exists()  # written off the request path
    write_ban_log()
    [ban] = Ban.objects.all()  # (the test clock is in 2023: current_bans() reads the wall clock)
    assert (ban.rule_name, ban.who, ban.times, ban.shadow) == ("scrapers", "127.0.0.1", 1, False)
    assert (ban.until - ban.since).total_seconds() == BAN_S
    [entry] = BanLogEntry.objects.all()
    assert (entry.kind, entry.rule_name, entry.bans, entry.callers[0]["who"]) == (
        "banned", "scrapers", 1, "127.0.0.1")
    assert AuditEntry.objects.count() == audited  # the audit trail keeps to configuration changes


def test_a_banned_request_debits_nothing(scraper_rule, redis_client):
    client = Client()
    walk_404s(client, THRESHOLD)
    before = {k: redis_client.get(k) for k in redis_client.scan_iter("rl:{*")}
    for _ in range(3):
        banned(client.get("/hello/", HTTP_X_API_KEY="rk_alice_free"))
    after = {k: redis_client.get(k) for k in redis_client.scan_iter("rl:{*")}
    assert after == before


def test_the_ban_ends_on_time_and_retries_do_not_extend_it(scraper_rule):
    _, clock = scraper_rule
    client = Client()
    walk_404s(client, THRESHOLD)
    clock.advance(BAN_S * 1000 - 1000)
    assert banned(client.get("/hello/"))["retry-after"] == 1  # retries did not push it back
    clock.advance(1001)
    assert client.get("/hello/").status_code == 200


def test_escalation_doubles_the_ban_up_to_its_maximum(scraper_rule):
    _, clock = scraper_rule
    client = Client()
    lengths = []
    for round_ in range(4):
        walk_404s(client, THRESHOLD, start=round_ * 10)
        lengths.append(int(client.get("/hello/")["Retry-After"]))
        clock.advance(lengths[-1] * 1000 + 1)
        assert client.get("/hello/").status_code == 200
    assert lengths == [BAN_S, 2 * BAN_S, 3 * BAN_S, 3 * BAN_S]  # doubled, then the maximum
    write_ban_log()
    assert list(Ban.objects.order_by("since").values_list("times", flat=True)) == [1, 2, 3, 4]


def test_a_ban_after_the_memory_starts_over(scraper_rule):
    _, clock = scraper_rule
    client = Client()
    walk_404s(client, THRESHOLD)
    clock.advance(86_400_000 + BAN_S * 1000 + 1)
    walk_404s(client, THRESHOLD, start=50)
    assert client.get("/hello/")["Retry-After"] == str(BAN_S)


def test_retries_extend_the_ban_when_the_rule_says_so(scraper_rule):
    rule, clock = scraper_rule
    rule.extend_on_retry = True
    rule.save()
    limiter().policies.reset()
    client = Client()
    walk_404s(client, THRESHOLD)
    clock.advance(BAN_S * 1000 - 1000)
    banned(client.get("/hello/"))  # a retry: the ban starts again
    assert banned(client.get("/hello/"))["retry-after"] == BAN_S


def test_lifting_a_ban_lets_the_caller_in_and_is_logged_in_the_ban_log(scraper_rule):
    client = Client()
    walk_404s(client, THRESHOLD)
    banned(client.get("/hello/"))
    write_ban_log()
    [ban] = Ban.objects.all()
    audited = AuditEntry.objects.count()
    assert limiter().protection.lift_ban(ban, Actor("staff", "admin")) is True
    assert client.get("/hello/").status_code == 200
    ban.refresh_from_db()
    assert ban.lifted_by == "staff" and not ban.in_force
    lift = BanLogEntry.objects.get(kind="lifted")
    assert (lift.who, lift.actor, lift.rule_name) == ("127.0.0.1", "staff", "scrapers")
    assert AuditEntry.objects.count() == audited


def test_shadow_mode_bans_no_one_and_counts(scraper_rule):
    rule, _ = scraper_rule
    rule.mode = "shadow"
    rule.save()
    limiter().policies.reset()
    client = Client()
    walk_404s(client, 2 * THRESHOLD)
    assert client.get("/hello/").status_code == 200
    write_ban_log()
    assert Ban.objects.filter(shadow=True).count() == 2  # two would-be bans
    [entry] = BanLogEntry.objects.all()
    assert (entry.shadow, entry.bans) == (True, 2)
    assert not WebhookDelivery.objects.exists()
    assert not current_bans().exists()


def test_a_ban_is_announced_by_webhook(scraper_rule):
    soc = WebhookEndpoint.objects.create(name="soc", url="https://example.com/hook")
    walk_404s(Client(), THRESHOLD)
    write_ban_log()
    [delivery] = WebhookDelivery.objects.filter(endpoint=soc)
    assert delivery.event == "caller.banned"
    assert json.loads(delivery.body)["data"]["rule"] == "scrapers"


@pytest.mark.parametrize("scope, headers", [("user", {"HTTP_X_API_KEY": "rk_bob_pro"})])
def test_a_ban_by_key_leaves_the_address_alone(scraper_rule, scope, headers):
    rule, _ = scraper_rule
    rule.scope = scope
    rule.save()
    limiter().policies.reset()
    client = Client()
    for i in range(THRESHOLD):
        assert client.get(f"/no-such-{i}/", **headers).status_code == 404
    banned(client.get("/hello/", **headers))
    assert client.get("/hello/", HTTP_X_API_KEY="rk_alice_free").status_code == 200


def test_a_credential_proven_from_the_address_does_not_pass_its_ban(scraper_rule):
    # the failed-authentication limit's proofs let a known key pass an empty limit, never a ban
    rule, _ = scraper_rule
    rule.scope = "user"
    rule.save()
    limiter().policies.reset()
    client = Client(HTTP_X_API_KEY="rk_bob_pro")
    assert client.get("/hello/").status_code == 200  # proven from this address
    walk_404s(client, THRESHOLD)
    banned(client.get("/hello/"))


async def _walk_and_ask(client):
    try:
        for i in range(THRESHOLD):
            assert (await client.get(f"/no-such-page-{i}/")).status_code == 404
        return await client.get("/hello/")
    finally:
        # the async store's connections belong to this event loop, which ends here
        await limiter().async_store().aclose()


@pytest.mark.django_db(transaction=True)
def test_the_async_path_counts_events_and_refuses_the_banned(scraper_rule):
    # QuotaMiddleware in async mode (AsyncClient): events counted in a thread, the ban checked
    # in the decision's own call, and the unresolved URLs charged like the others
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    # (async_to_sync: the middleware's thread-sensitive work runs on this thread, with the
    # test's own database connection, as under Django's ASGI handler)
    refused = async_to_sync(_walk_and_ask)(AsyncClient())
    assert refused.status_code == 429
    assert json.loads(refused.content)["banned-by"] == ["scrapers"]


def test_after_a_ban_this_workers_remembered_refusals_say_banned(db):
    # the caller is refused from this worker's memory for its quota; the refusals it keeps
    # sending ban it: the next answer, from memory too, says banned, not "quota exceeded"
    plan = Plan.objects.create(slug="tight", name="Tight", default_for_anonymous=True)
    Rule.objects.create(name="own-ip", plan=plan, scope=Scope.IP, rate=1, period_s=60,
                        burst=2)
    BanRule.objects.create(name="hammering", scope="ip", events="refusals", threshold=3,
                           window_s=60, ban_s=BAN_S)
    clock = use_fake_clock()
    limiter().policies.reset()
    client = Client()
    assert [client.get("/hello/").status_code for _ in range(3)] == [200, 200, 429]
    remembered = [client.get("/hello/") for _ in range(2)]   # refusals 2 and 3: the ban
    assert all(r.wsgi_request.ratelimit.from_deny_cache for r in remembered)
    write_ban_log()
    assert Ban.objects.count() == 1
    response = client.get("/hello/")
    assert response.wsgi_request.ratelimit.from_deny_cache
    body = banned(response)
    assert body["banned-by"] == ["hammering"] and int(response["Retry-After"]) == BAN_S
    # and it still holds when the quota is whole again, until the ban ends
    clock.advance(120_000)
    assert banned(client.get("/hello/"))["banned-by"] == ["hammering"]
    # what the worker remembers of the ban never outlives it
    clock.advance(BAN_S * 1000 - 120_000)
    assert client.get("/hello/").status_code == 200
