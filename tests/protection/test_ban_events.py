"""What counts towards a caller's ban (issue 56): a refusal only when a bucket of the caller's
own refused it (never a global, plan or tenant bucket that others drain, nor a shadow bucket),
and a retry during a ban extends only the bans that refused it, never counting as an event."""

import json

import pytest
from django.test import Client

from ratelimit_app.decision.headers import BANNED
from ratelimit_app.models import Ban, BanRule, Rule
from ratelimit_app.protection import bans

from ..helpers import limiter, load_demo_data, use_fake_clock


def ban_rows():
    """The Ban rows, once the bans noted so far are written (the ban log's thread does that off
    the request path; it is off in unit tests)."""
    limiter().protection.ban_log.drain()
    return Ban.objects

pytestmark = pytest.mark.django_db

THRESHOLD = 5
PLAN_BURST = 50  # free-plan, made small enough to drain here
ATTACKERS = [f"203.0.113.{i}" for i in range(1, 6)]


@pytest.fixture
def clock():
    load_demo_data()
    Rule.objects.filter(name="free-plan").update(burst=PLAN_BURST, rate=PLAN_BURST)
    return use_fake_clock()


def refusal_rule(scope):
    """The issue's rule: the 5th refusal within a minute bans for 600 s."""
    BanRule.objects.create(name=f"{scope}-refusals", scope=scope, events="refusals",
                           threshold=THRESHOLD, window_s=60, ban_s=600, factor=2)
    limiter().policies.reset()


def drain_the_plan():
    """Anonymous callers from rotating addresses (each far under its own free-ip limit of 40)
    empty the shared free-plan bucket."""
    for i in range(PLAN_BURST):
        assert Client(REMOTE_ADDR=ATTACKERS[i % len(ATTACKERS)]).get("/hello/").status_code == 200
    refused = Client(REMOTE_ADDR=ATTACKERS[0]).get("/hello/")
    assert "free-plan" in json.loads(refused.content)["violated-policies"]


def refused_by(response):
    """The policies that refused a quota refusal (not a ban)."""
    assert response.status_code == 429, response.content
    body = json.loads(response.content)
    assert body["type"] != BANNED, body
    return body["violated-policies"]


def is_banned(response):
    return response.status_code == 429 and json.loads(response.content)["type"] == BANNED


ALICE = {"HTTP_X_API_KEY": "rk_alice_free"}


def test_refusals_by_a_drained_plan_bucket_do_not_ban_a_user(clock):
    refusal_rule("user")
    drain_the_plan()
    alice = Client(REMOTE_ADDR="198.51.100.20", **ALICE)
    for _ in range(3 * THRESHOLD):  # her own free-user bucket (30) is far from empty
        assert refused_by(alice.get("/hello/")) == ["free-plan"]
    clock.advance(60_000)  # the drain stops: the plan refills
    assert alice.get("/hello/").status_code == 200
    assert not ban_rows().exists()


def test_refusals_by_a_drained_plan_bucket_do_not_ban_an_address(clock):
    refusal_rule("ip")
    drain_the_plan()
    bystander = Client(REMOTE_ADDR="198.51.100.21")
    for _ in range(3 * THRESHOLD):
        assert refused_by(bystander.get("/hello/")) == ["free-plan"]
    for attacker in ATTACKERS:  # the drainers' own refusals were the plan's too
        assert refused_by(Client(REMOTE_ADDR=attacker).get("/hello/")) == ["free-plan"]
    clock.advance(60_000)
    assert bystander.get("/hello/").status_code == 200
    assert not ban_rows().exists()


def test_a_shadow_bucket_short_for_the_caller_does_not_make_a_shared_refusal_its_own(clock):
    # alice is past her own limit, but it is in shadow mode: only the plan refused her
    Rule.objects.filter(name="free-user").update(mode="shadow", burst=3)
    refusal_rule("user")
    drain_the_plan()
    alice = Client(REMOTE_ADDR="198.51.100.20", **ALICE)
    for _ in range(2 * THRESHOLD):
        assert refused_by(alice.get("/hello/")) == ["free-plan"]
    assert not ban_rows().exists()


def test_a_tenant_rule_does_not_count_a_global_bucket_others_drain(clock):
    Rule.objects.filter(name="global").update(burst=PLAN_BURST, rate=PLAN_BURST)
    refusal_rule("tenant")
    drain_the_plan()  # the anonymous drain empties the global bucket as well
    carol = Client(REMOTE_ADDR="198.51.100.22", HTTP_X_API_KEY="rk_carol_enterprise")
    for _ in range(2 * THRESHOLD):
        assert refused_by(carol.get("/hello/")) == ["global"]
    assert not ban_rows().exists()


def exceed_own_bucket(client, allowed, clock):
    """Spend ``allowed`` requests, then be refused THRESHOLD times by the caller's own bucket:
    the last refusal bans (seen once the bucket holds tokens again)."""
    for _ in range(allowed):
        assert client.get("/hello/").status_code == 200
    for _ in range(THRESHOLD):
        response = client.get("/hello/")
        assert response.status_code == 429 and not is_banned(response)
    clock.advance(60_000)
    assert is_banned(client.get("/hello/"))


# (scope, the caller, the requests its own bucket lets through: free-ip 40, free-user 30;
# carol's enterprise-user and enterprise-tenant made small below)
OWN_BUCKETS = [
    ("ip", {"REMOTE_ADDR": "198.51.100.30"}, 40, None),
    ("user", ALICE, 30, None),
    ("user", {"HTTP_X_API_KEY": "rk_carol_enterprise"}, 6, "enterprise-user"),
    ("tenant", {"HTTP_X_API_KEY": "rk_carol_enterprise"}, 6, "enterprise-tenant"),
    ("tenant", {"HTTP_X_API_KEY": "rk_carol_enterprise"}, 6, "enterprise-user"),
]


@pytest.mark.parametrize("scope, headers, allowed, small", OWN_BUCKETS,
                         ids=["ip", "user", "key", "tenant", "tenant-member"])
def test_a_caller_draining_its_own_bucket_is_still_banned(clock, scope, headers, allowed, small):
    if small:
        Rule.objects.filter(name=small).update(burst=allowed, rate=1)
    refusal_rule(scope)
    exceed_own_bucket(Client(**headers), allowed, clock)
    [ban] = ban_rows().all()
    assert (ban.rule_name, ban.times) == (f"{scope}-refusals", 1)


def test_a_key_is_a_caller_of_its_own_at_user_scope(clock):
    # alice's key drains its own free-user bucket and is banned; alice's session is another
    # caller (its own buckets), and is not
    from django.contrib.auth import get_user_model

    refusal_rule("user")
    exceed_own_bucket(Client(**ALICE), 30, clock)
    session = Client()
    session.force_login(get_user_model().objects.get(username="alice"))
    assert session.get("/hello/").status_code == 200


# --- retries -----------------------------------------------------------------------------------

@pytest.fixture
def vault_and_extender():
    """The issue's two rules: 404s under /vault ban for 600 s, retries do not extend; 404s under
    /xt ban for 2 s, retries extend."""
    load_demo_data()
    clock = use_fake_clock()
    vault = BanRule.objects.create(name="vault-404", scope="ip", events="statuses",
                                   statuses="404", path_prefix="/vault", threshold=3,
                                   window_s=60, ban_s=600)
    BanRule.objects.create(name="extender", scope="ip", events="statuses", statuses="404",
                           path_prefix="/xt", threshold=3, window_s=60, ban_s=2,
                           extend_on_retry=True)
    limiter().policies.reset()
    return vault, clock


def test_retries_during_another_rules_ban_are_no_events_and_a_lift_frees_the_caller(
        vault_and_extender):
    from ratelimit_app.config.audit import Actor

    client = Client()
    assert [client.get(f"/vault/{i}/").status_code for i in range(1, 4)] == [404] * 3
    for _ in range(6):  # retries: the vault's ban refuses them; the extender never saw /xt
        response = client.get("/hello/")
        assert json.loads(response.content)["banned-by"] == ["vault-404"]
    assert list(ban_rows().values_list("rule_name", flat=True)) == ["vault-404"]

    limiter().protection.lift_ban(ban_rows().get(), Actor("staff", "admin"))
    assert [client.get("/hello/").status_code for _ in range(3)] == [200] * 3


def test_a_retry_extends_only_its_own_rules_ban(vault_and_extender):
    _, clock = vault_and_extender
    client = Client()
    for i in range(3):
        assert client.get(f"/xt/{i}/").status_code == 404  # the extender bans for 2 s
    assert [client.get(f"/vault/{i}/").status_code for i in range(3)] == [429] * 3
    clock.advance(1500)
    assert json.loads(client.get("/hello/").content)["banned-by"] == ["extender"]
    clock.advance(1500)  # past the 2 s: the retries extended it
    assert json.loads(client.get("/hello/").content)["banned-by"] == ["extender"]
    clock.advance(2001)
    assert client.get("/hello/").status_code == 200
    # the vault's rule counted none of the refused /vault/ requests: 2 more 404s do not ban
    assert [client.get(f"/vault/{i}/").status_code for i in range(2)] == [404] * 2
    assert client.get("/hello/").status_code == 200
    assert list(ban_rows().values_list("rule_name", flat=True)) == ["extender"]


def test_a_retry_after_its_ban_ended_is_not_counted(vault_and_extender):
    # a retry the ban refused, counted once the ban is lifted (the order of a race): no event
    client = Client()
    for i in range(3):
        assert client.get(f"/xt/{i}/").status_code == 404
    [ban] = ban_rows().all()
    protection = limiter().protection
    rule = next(r for r in limiter().policies.get().ban_rules if r.name == "extender")
    [lifted] = protection.bans.lift(ban.key, [rule])
    assert lifted.outcome == bans.LIFTED
    limiter().deny_cache.clear()  # as lift_ban's new config version makes every worker's do
    for _ in range(THRESHOLD):
        [outcome] = protection.bans.count(None, {ban.key: [rule]}, retry=True)
        assert outcome.outcome == bans.NOT_BANNED
    assert client.get("/hello/").status_code == 200
    # its events start from none: two 404s under /xt do not ban (three would)
    for i in range(2):
        assert client.get(f"/xt/{i}/").status_code == 404
    assert client.get("/hello/").status_code == 200
