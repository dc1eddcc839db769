"""The lists on the request path, against the suite's real Redis: a deny refuses (403, its own
problem type, its reason and never its value) and an exempt allow passes, both without one Redis
command (INFO commandstats); a trusted caller is limited as anyone but marked; IPv6 ranges; an
entry's start and end keep time (the clock seam, no sleeps); a plain view and a DRF view."""

import json
from datetime import datetime, timedelta, timezone

import pytest
from asgiref.sync import async_to_sync
from django.test import Client, RequestFactory

from ratelimit_app.decision.headers import DENIED_BY_LIST
from ratelimit_app.models import AccessListEntry, ApiKey, Plan, Rule, Scope
from ratelimit_app.protection.lists import is_trusted

from ..helpers import limiter, use_fake_clock

# real commits: an edit publishes a new config version at its commit, as in production
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quota():
    Plan.objects.create(slug="free", name="Free", default_for_anonymous=True,
                        default_for_authenticated=True)
    Rule.objects.create(name="per-ip", scope=Scope.IP, rate=100, period_s=60, burst=100)


def commands(redis_client):
    """The server's count of every command run so far, by name (INFO itself left out)."""
    return {name: stat["calls"] for name, stat in redis_client.info("commandstats").items()
            if name != "cmdstat_info"}


def sent_since(before, redis_client):
    """The commands run since ``before`` (``commands()``), by name."""
    after = commands(redis_client)
    return {name: calls - before.get(name, 0) for name, calls in after.items()
            if calls != before.get(name, 0)}


def get(path="/hello/", ip="192.0.2.1", **headers):
    return Client().get(path, REMOTE_ADDR=ip, **headers)


def problem(response):
    assert response["Content-Type"] == "application/problem+json"
    return json.loads(response.content)


def deny(value, reason="abuse from this network: write to abuse@example.com", **fields):
    return AccessListEntry.objects.create(kind="deny", target="ip", value=value, reason=reason,
                                          **fields)


def test_a_denied_caller_is_refused_403_naming_the_reason_without_a_redis_command(
        quota, redis_client):
    deny("203.0.113.0/24")
    assert get(ip="203.0.113.1").status_code == 403  # the snapshot is compiled on first use
    before = commands(redis_client)
    responses = [get(ip=f"203.0.113.{n}") for n in range(2, 22)]
    assert sent_since(before, redis_client) == {}
    for response in responses:
        assert response.status_code == 403
        body = problem(response)
        assert body == {"type": DENIED_BY_LIST, "title": "Denied", "status": 403,
                        "detail": "Requests from this caller are refused: abuse from this "
                                  "network: write to abuse@example.com",
                        "reason": "abuse from this network: write to abuse@example.com"}
        assert "203.0.113" not in response.content.decode()  # never what the entry matched
        assert not {"RateLimit", "RateLimit-Policy", "Retry-After"} & set(response.headers)
    assert not redis_client.keys("rl:{*")  # no bucket was read or written
    # nor does an unknown API key cost it a failed authentication's charge: it tried nothing
    Rule.objects.create(name="auth-failures", scope=Scope.IP, counts="failed_auth", rate=1,
                        period_s=60, burst=3)
    get(ip="203.0.113.1")
    before = commands(redis_client)
    assert get(ip="203.0.113.1", HTTP_X_API_KEY="rk_guess").status_code == 403
    assert sent_since(before, redis_client) == {}
    # another caller is limited as before: one call, its headers
    assert get(ip="192.0.2.1")["RateLimit"] == '"per-ip";r=99;t=1'
    before = commands(redis_client)
    response = get(ip="192.0.2.1")
    assert response.status_code == 200 and response["RateLimit"] == '"per-ip";r=98;t=1'
    assert sent_since(before, redis_client)["cmdstat_evalsha"] == 1


def test_an_allow_entry_exempt_from_quotas_passes_without_a_redis_command(quota, redis_client):
    AccessListEntry.objects.create(kind="allow", target="ip", value="198.51.100.0/24",
                                   exempt=True, reason="our monitoring")
    get(ip="198.51.100.1")
    before = commands(redis_client)
    responses = [get(ip="198.51.100.9") for _ in range(150)]  # above the rule's burst
    assert sent_since(before, redis_client) == {}
    assert {response.status_code for response in responses} == {200}
    assert not {"RateLimit", "RateLimit-Policy"} & set(responses[0].headers)
    decision = limiter().decide(RequestFactory().get("/hello/", REMOTE_ADDR="198.51.100.9"),
                                None, "hello")
    assert decision.allowed and decision.exempt and decision.identity.trusted
    assert decision.listed.reason == "our monitoring"


def test_a_trusted_caller_is_limited_as_anyone_and_marked_trusted(quota):
    AccessListEntry.objects.create(kind="allow", target="ip", value="198.51.100.0/24",
                                   reason="partner office")
    trusted = RequestFactory().get("/hello/", REMOTE_ADDR="198.51.100.9")
    decision = limiter().decide(trusted, None, "hello")
    assert decision.allowed and not decision.exempt and decision.identity.trusted
    assert [status.name for status in decision.policies] == ["per-ip"]
    other = limiter().decide(RequestFactory().get("/hello/", REMOTE_ADDR="192.0.2.1"), None,
                             "hello")
    assert not other.identity.trusted
    snapshot = limiter().snapshot()
    assert is_trusted(snapshot, trusted, other.identity._replace(ip="198.51.100.9"),
                      limiter().wall_time)
    assert not is_trusted(snapshot, trusted, other.identity, limiter().wall_time)
    for _ in range(99):  # (the decision above took one token)
        assert get(ip="198.51.100.9").status_code == 200
    assert get(ip="198.51.100.9").status_code == 429  # its quota binds


def test_an_ipv6_deny_range_refuses_the_callers_it_holds(quota):
    deny("2001:db8::/48", reason="v6 abuse")
    refused = get(ip="2001:db8:0:7::1")
    assert refused.status_code == 403 and problem(refused)["reason"] == "v6 abuse"
    assert get(ip="2001:db8:0:ffff:ffff::2").status_code == 403
    assert get(ip="2001:db8:1::1").status_code == 200
    assert get(ip="::ffff:192.0.2.1").status_code == 200


def test_a_dated_entry_starts_and_stops_on_time(quota, monkeypatch):
    clock = use_fake_clock(monkeypatch)
    now = datetime.fromtimestamp(clock.wall_time(), tz=timezone.utc)
    deny("203.0.113.7", reason="cool off", starts_at=now + timedelta(seconds=10),
         ends_at=now + timedelta(seconds=70))
    assert get(ip="203.0.113.7").status_code == 200
    clock.advance(9_999)
    assert get(ip="203.0.113.7").status_code == 200
    clock.advance(1)
    refused = get(ip="203.0.113.7")
    assert refused.status_code == 403
    # the entry ends: the caller may come back then
    assert refused["Retry-After"] == "60" and problem(refused)["retry-after"] == 60
    clock.advance(59_999)
    assert get(ip="203.0.113.7").status_code == 403
    clock.advance(1)
    assert get(ip="203.0.113.7").status_code == 200


def test_an_ended_entry_stops_even_before_its_snapshot_is_replaced(quota, monkeypatch):
    clock = use_fake_clock(monkeypatch)
    now = datetime.fromtimestamp(clock.wall_time(), tz=timezone.utc)
    deny("203.0.113.7", reason="cool off", ends_at=now + timedelta(seconds=5))
    assert get(ip="203.0.113.7").status_code == 403
    held = limiter().snapshot()
    clock.advance(5_000)
    # the snapshot still holds the entry (as a worker would until its watcher switches)...
    assert held.access_lists is not None
    # ... and the entry no longer decides
    request = RequestFactory().get("/hello/", REMOTE_ADDR="203.0.113.7")
    assert limiter()._prepare(held, request, None, "hello", None).snapshot is held


def test_keys_users_user_agents_and_the_drf_throttle(quota, django_user_model):
    user = django_user_model.objects.create_user("mallory")
    key, raw = ApiKey.create_key(user, "scraper")
    AccessListEntry.objects.create(kind="deny", target="api_key", api_key=key,
                                   reason="unpaid invoice")
    AccessListEntry.objects.create(kind="deny", target="user_agent", value="sqlmap",
                                   reason="no scanners")
    refused = get("/api/items/", HTTP_X_API_KEY=raw)
    assert refused.status_code == 403
    assert json.loads(refused.content)["reason"] == "unpaid invoice"  # DRF's own answer
    assert get("/api/items/").status_code == 200
    scanner = get(HTTP_USER_AGENT="sqlmap/1.7.2#stable")
    assert scanner.status_code == 403 and problem(scanner)["reason"] == "no scanners"
    AccessListEntry.objects.create(kind="deny", target="user", user=user, reason="banned user")
    other_key, other_raw = ApiKey.create_key(user, "second")
    assert problem(get(HTTP_X_API_KEY=other_raw))["reason"] == "banned user"


def test_an_edit_binds_at_once_and_a_removal_too(quota):
    assert get(ip="203.0.113.7").status_code == 200
    entry = deny("203.0.113.7")
    assert get(ip="203.0.113.7").status_code == 403
    entry.delete()
    assert get(ip="203.0.113.7").status_code == 200


def test_the_event_loops_path_screens_as_the_threads_does(quota, redis_client):
    deny("203.0.113.0/24", reason="async abuse")
    AccessListEntry.objects.create(kind="allow", target="ip", value="198.51.100.0/24",
                                   exempt=True, reason="monitoring")
    limiter().snapshot()  # compiled here, not on the loop
    before = commands(redis_client)

    async def decide_both():
        factory = RequestFactory()
        denied = await limiter().adecide(factory.get("/hello/", REMOTE_ADDR="203.0.113.5"),
                                         None, "hello")
        exempt = await limiter().adecide(factory.get("/hello/", REMOTE_ADDR="198.51.100.5"),
                                         None, "hello")
        return denied, exempt

    denied, exempt = async_to_sync(decide_both)()
    assert not denied.allowed and denied.listed.reason == "async abuse"
    assert exempt.allowed and exempt.exempt and exempt.identity.trusted
    assert sent_since(before, redis_client) == {}
