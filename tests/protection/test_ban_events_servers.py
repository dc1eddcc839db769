"""Bans count only the caller's own abuse, on real servers (issue 56): gunicorn with 3 sync
workers on a Redis node and on the 3-master Cluster, behind a trusted proxy (callers told apart
by X-Forwarded-For). Anonymous callers from rotating addresses drain the shared plan bucket; a
user under its own limit, and an address under its own, are refused by the plan bucket again
and again and never banned. The rules still work: a user exceeding its own bucket (from
addresses it rotates) is banned by the user rule, and an address exceeding its own bucket by the
address rule, which leaves the user it carried alone."""

import json
import time

import pytest

from ..asgi_server import POLL_INTERVAL_S, get
from ..config.test_reload_live import python
from .test_bans_servers import start_deployment

# (what is counted lives in Redis and the workers: no database concurrency to test again on
# PostgreSQL, which tests/protection/test_ban_records_servers.py does for the ban log)
pytestmark = [pytest.mark.slow, pytest.mark.deployment]

THRESHOLD = 5
PLAN_BURST = 40
# free: a shared plan bucket that refills one token an hour (drained, it stays empty), and each
# caller's own buckets refilling a token a second; pro: no plan bucket. Both ban rules count
# refusals, as in the issue.
SETUP = f"""
import django
django.setup()
from django.contrib.auth.models import User
from ratelimit_app.models import ApiKey, BanRule, Plan, PlanAssignment, Rule
free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True,
                           default_for_authenticated=True)
pro = Plan.objects.create(slug="pro", name="Pro")
Rule.objects.create(name="free-plan", plan=free, scope="plan", rate=1, period_s=3600,
                    burst={PLAN_BURST})
Rule.objects.create(name="every-ip", plan=None, scope="ip", rate=1, period_s=1, burst=10)
Rule.objects.create(name="free-user", plan=free, scope="user", rate=1, period_s=1, burst=30)
Rule.objects.create(name="pro-user", plan=pro, scope="user", rate=1, period_s=1, burst=20)
for name, plan in (("alice", free), ("bob", pro), ("carol", pro)):
    user = User.objects.create_user(name)
    PlanAssignment.objects.create(user=user, plan=plan)
    ApiKey.create_key(user, "demo", raw_key=f"rk_{{name}}_key_of_the_test")
for scope in ("user", "ip"):
    BanRule.objects.create(name=f"{{scope}}-refusals", scope=scope, events="refusals",
                           threshold={THRESHOLD}, window_s=60, ban_s=600, factor=2)
"""
BANS = """
import json
import django
django.setup()
from ratelimit_app.models import Ban
print(json.dumps(sorted([b.rule_name, b.who] for b in Ban.objects.all())))
"""
DEPLOYMENTS = [("gunicorn", "redis"), ("gunicorn", "cluster")]


@pytest.fixture(scope="module", params=DEPLOYMENTS, ids="-".join)
def deployment(request, tmp_path_factory, redis_server, database_env):
    yield from start_deployment(request, tmp_path_factory, redis_server, database_env, SETUP,
                                DEMO_BEHIND_PROXY="1")


def key_of(name):
    return {"X-Api-Key": f"rk_{name}_key_of_the_test"}


def bans(env):
    """Every Ban row: [rule, who], sorted."""
    return json.loads(python(["-c", BANS], env))


def refusal(answer):
    """The policies that refused ``answer``, a quota refusal (never a ban's)."""
    assert answer.status == 429, answer.body
    body = answer.json()
    assert "banned-by" not in body, body
    return body["violated-policies"]


def banned_by(server, client_ip, headers=()):
    """Ask until the caller's refusal names its ban (a worker's deny cache may answer from the
    bucket that refused for up to a second); return the ban's rules."""
    deadline = time.monotonic() + 15
    while True:
        answer = get(server, "/hello/", client_ip, headers)
        if answer.status == 429 and "banned-by" in answer.json():
            return answer.json()["banned-by"]
        assert time.monotonic() < deadline, f"never banned: {answer.status} {answer.body}"
        time.sleep(POLL_INTERVAL_S)


def test_a_drained_plan_bucket_bans_no_one_it_refuses(deployment):
    server, env, _, workers = deployment
    attackers = [f"203.0.113.{i}" for i in range(1, 9)]
    for i in range(PLAN_BURST):  # 5 each: far under their own limit of 10
        assert get(server, "/hello/", attackers[i % len(attackers)]).status == 200
    assert "free-plan" in refusal(get(server, "/hello/", attackers[0]))

    seen_by = set()
    for _ in range(3 * THRESHOLD):  # alice's own bucket holds 30, her address's 10
        answer = get(server, "/hello/", "198.51.100.20", key_of("alice"))
        assert refusal(answer) == ["free-plan"]
        seen_by.add(answer.headers["RateLimit-Worker"])
        assert refusal(get(server, "/hello/", "198.51.100.21")) == ["free-plan"]  # anonymous
    for attacker in attackers:  # the drainers' own refusals are the plan's too
        for _ in range(THRESHOLD):
            assert refusal(get(server, "/hello/", attacker)) == ["free-plan"]
    # a ban refuses from Redis the moment it is imposed (its row is written later, off the
    # request path): past the deny cache's second, alice's refusals still name no ban
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        assert refusal(get(server, "/hello/", "198.51.100.20", key_of("alice"))) == ["free-plan"]
        time.sleep(POLL_INTERVAL_S)
    assert bans(env) == []
    print(f"refused by the plan bucket on workers {sorted(seen_by)}; no ban")


def refuse_until_threshold(server, addresses, headers, policy):
    """Ask as one caller, from ``addresses`` in turn, until ``policy`` alone has refused it
    THRESHOLD times (its own bucket refills a token a second, so a request may pass between)."""
    refused = 0
    for i in range(100):
        answer = get(server, "/hello/", addresses[i % len(addresses)], headers)
        if answer.status != 200:
            assert refusal(answer) == [policy]
            refused += 1
            if refused == THRESHOLD:
                return
    pytest.fail(f"refused {refused} times only")


def test_a_caller_exceeding_its_own_bucket_is_still_banned(deployment):
    server, env, _, _ = deployment
    # bob rotates four addresses (each under its own 10): his own bucket (20) runs out
    addresses = [f"198.51.100.{i}" for i in range(30, 34)]
    refuse_until_threshold(server, addresses, key_of("bob"), "pro-user")
    assert banned_by(server, addresses[0], key_of("bob")) == ["user-refusals"]

    # carol from one address: her address's bucket (10) runs out before her own (20)
    refuse_until_threshold(server, ["198.51.100.40"], key_of("carol"), "every-ip")
    assert banned_by(server, "198.51.100.40", key_of("carol")) == ["ip-refusals"]
    # the address's refusals were not carol's own: from another address she is served
    assert get(server, "/hello/", "198.51.100.41", key_of("carol")).status == 200
    # the rows are written off the request path, within a moment of the bans
    deadline = time.monotonic() + 15
    while sorted(rule for rule, _ in bans(env)) != ["ip-refusals", "user-refusals"]:
        assert time.monotonic() < deadline, bans(env)
        time.sleep(POLL_INTERVAL_S)
