"""The caller's page (admin/callers/): where its plan comes from, what is left now in one
read, the run-out estimate on an injected clock, the per-caller history the flush writes
(bounded: never per address), and its actions."""

import datetime
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client, RequestFactory
from django.utils import timezone

from ratelimit_app.admin.callers.caller import caller_of, plan_source
from ratelimit_app.admin.callers.pace import Pace, pace_of, run_out
from ratelimit_app.admin.dashboard.inspector import find_identity
from ratelimit_app.metrics.caller_history import HISTORY_TTL_S, read_history
from ratelimit_app.models import ApiKey, IdentityOverride, Plan, PlanAssignment, Rule

from ..helpers import decide, limiter, use_fake_clock

pytestmark = pytest.mark.django_db

CALLERS = "/admin/ratelimit_monitoring/dashboard/callers/"
# Monday 7 December 2026, 10:30 UTC
NOW = datetime.datetime(2026, 12, 7, 10, 30, tzinfo=datetime.timezone.utc)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def demo():
    call_command("load_demo", stdout=io.StringIO())


@pytest.fixture
def admin_client(demo):
    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    return client


def caller(query):
    lookup = find_identity(query, limiter().snapshot())
    assert lookup.identity is not None, query
    return caller_of(lookup)


def request_as(api_key="", ip="192.0.2.10"):
    extra = {"HTTP_X_API_KEY": api_key} if api_key else {}
    return RequestFactory().get("/api/items/", REMOTE_ADDR=ip, **extra)


def call(api_key="", ip="192.0.2.10"):
    """A real request to the demo API (the middleware decides it and counts it for the
    metrics); returns whether it was allowed."""
    extra = {"HTTP_X_API_KEY": api_key} if api_key else {}
    return Client().get("/api/items/", REMOTE_ADDR=ip, **extra).status_code != 429


def test_the_plan_says_where_it_comes_from(demo):
    snapshot = limiter().snapshot()
    alice_key = ApiKey.objects.get(user__username="alice")
    # the demo's keys have no plan of their own: their user's assignment gives it
    source = plan_source(caller(f"key:{alice_key.pk}"), snapshot)
    assert (source.slug, source.source, source.words) == (
        "free", "assignment", "its user's plan assignment")
    assert source.source_url.endswith(
        f"/planassignment/{PlanAssignment.objects.get(user=alice_key.user).pk}/change/")
    assert plan_source(caller("alice"), snapshot).words == "its plan assignment"

    alice_key.plan = Plan.objects.get(slug="pro")
    alice_key.save()
    limiter().bump_config_version()
    source = plan_source(caller(f"key:{alice_key.pk}"), limiter().snapshot())
    assert (source.slug, source.name, source.source) == ("pro", "Pro", "key")

    # a key plan outside its dates: its user's plan, and a note saying why
    alice_key.ends_at = timezone.now() - datetime.timedelta(hours=1)
    alice_key.starts_at = alice_key.ends_at - datetime.timedelta(days=1)
    alice_key.save()
    limiter().bump_config_version()
    source = plan_source(caller(f"key:{alice_key.pk}"), limiter().snapshot())
    assert (source.slug, source.source) == ("free", "assignment")
    assert "The key's own plan (Pro) is not in force now" in source.note

    get_user_model().objects.create_user("newcomer")
    limiter().bump_config_version()
    snapshot = limiter().snapshot()
    assert plan_source(caller("newcomer"), snapshot).source == "default"
    source = plan_source(caller("203.0.113.9"), snapshot)
    assert (source.slug, source.words) == ("free", "the default plan for anonymous callers")


def test_every_rule_in_the_rules_lists_words_with_what_is_left_in_one_read(admin_client,
                                                                          redis_client):
    use_fake_clock(now_ms=int(NOW.timestamp() * 1000))  # no refill while the test runs
    key = ApiKey.objects.get(user__username="alice")
    for _ in range(31):  # free-user: bursts up to 30
        decide(request_as("rk_alice_free"), None, "api:items")
    before = redis_client.info("commandstats")
    page = admin_client.get(CALLERS, {"q": f"key:{key.pk}"})
    after = redis_client.info("commandstats")
    scripts = sum(after.get(name, {}).get("calls", 0) - before.get(name, {}).get("calls", 0)
                  for name in ("cmdstat_evalsha", "cmdstat_eval"))
    assert scripts == 1  # every bucket of the page in one non-debiting call
    rows = {row["rule"]: row for row in page.context["rows"]}
    assert rows["free-user"]["words"] == Rule.objects.get(name="free-user").describe()
    assert rows["free-user"]["tokens"] == 0 and rows["free-user"]["state"] == \
        "empty: refusing now"
    assert page.context["rows"][0]["rule"] == "free-user"  # the refusing rule first
    html = page.content.decode()
    assert "Refused now by <strong>free-user</strong>" in html
    # nothing was charged by looking
    assert admin_client.get(CALLERS, {"q": f"key:{key.pk}"}).context["rows"][0]["tokens"] == 0
    assert decide(request_as("rk_alice_free"), None, "api:items").allowed is False


def test_refusals_by_rule_come_from_the_hourly_history_the_flush_writes(demo, redis_client):
    clock = use_fake_clock(now_ms=int(NOW.timestamp() * 1000))
    key = ApiKey.objects.get(user__username="alice")
    outcomes = [call("rk_alice_free") for _ in range(35)]
    assert outcomes.count(False) == 5
    limiter().flusher.flush_now()
    hours = read_history(redis_client, "rl", f"key:{key.pk}", clock.seconds())
    assert len(hours) == 24 and hours[-1]["hour"] == NOW.replace(minute=0).timestamp()
    assert (hours[-1]["allowed"], hours[-1]["refused"]) == (30, 5)
    assert hours[-1]["refused_by"] == {"free-user": 5}
    assert hours[-1]["units"]["free-user"] == 30
    assert sum(row["allowed"] + row["refused"] for row in hours[:-1]) == 0
    [history_key] = redis_client.keys("rl:m:who:*")
    assert 0 < redis_client.ttl(history_key) <= HISTORY_TTL_S


def test_a_flood_of_addresses_creates_no_history_key(demo, redis_client):
    """Per-address history would let one client grow Redis by rotating addresses: anonymous
    callers get none, however many; their page reads the hot-key sets."""
    use_fake_clock(now_ms=int(NOW.timestamp() * 1000))
    for index in range(300):
        call(ip=f"10.{index // 250}.{index % 250}.1")
    call("rk_bob_pro")
    limiter().flusher.flush_now()
    bob = ApiKey.objects.get(user__username="bob")
    assert [key.decode() for key in redis_client.keys("rl:m:who:*")] == [
        f"rl:m:who:key:{bob.pk}:{int(NOW.timestamp()) // 3600}"]
    history = Client()
    history.force_login(get_user_model().objects.get(username="admin"))
    page = history.get(CALLERS, {"q": "ip:10.0.0.1"})
    assert page.context["history"]["kept"] is False
    assert b"The history of a client IP is not kept" in page.content


def test_run_out_at_a_known_pace():
    now = NOW.timestamp()
    hours = [{"hour": now - 1800, "units": {"monthly": 100}}]  # 100 in the current half hour
    pace = pace_of(hours, "monthly", now)
    assert (pace.units, pace.span_s) == (100, 3600)  # at least an hour: not 200 an hour
    # 9,900 left at 100 an hour: 99 hours, before the month's end
    estimate = run_out("10,000 a month", 9900, pace, now,
                       resets_at=datetime.datetime(2027, 1, 1, tzinfo=datetime.timezone.utc)
                       .timestamp())
    assert estimate.at == now + 99 * 3600
    assert estimate.text == ("at this pace (100 in the last hour), 10,000 a month runs out "
                             "on 11 December at 13:30 (an estimate)")
    slow = run_out("10,000 a month", 9900, Pace(1, 86400), now,
                   resets_at=now + 86400 * 24)
    assert slow.at is None and slow.text.endswith("lasts until it resets on 31 December at 10:30")
    assert run_out("the balance", 0, pace, now).text == "the balance is used up"
    assert run_out("the balance", 5, Pace(0, 0), now).at is None


def test_the_page_estimates_when_a_calendar_quota_runs_out_on_the_injected_clock(admin_client):
    clock = use_fake_clock(now_ms=int(NOW.timestamp() * 1000))
    Rule.objects.create(name="alice-monthly", plan=Plan.objects.get(slug="free"), scope="user",
                        kind="calendar", calendar_period="month", rate=10_000,
                        period_s=31 * 86400, burst=10_000)
    limiter().bump_config_version()
    for _ in range(25):  # within free-user's burst of 30
        assert call("rk_alice_free")
    limiter().flusher.flush_now()
    key = ApiKey.objects.get(user__username="alice")
    rows = {row["rule"]: row for row in
            admin_client.get(CALLERS, {"q": f"key:{key.pk}"}).context["rows"]}
    monthly = rows["alice-monthly"]
    assert monthly["tokens"] == 9975
    # 25 units in the current hour, taken as an hour's pace: 9,975 / 25 = 399 hours left
    assert monthly["run_out"].at == clock.seconds() + 399 * 3600
    assert monthly["run_out"].text == ("at this pace (25 in the last hour), 10,000 a month "
                                       "runs out on 24 December at 01:30 (an estimate)")
    assert rows["free-user"]["run_out"] is None  # a token bucket refills: nothing runs out


def test_end_an_override_now_from_the_callers_page(admin_client):
    dana = get_user_model().objects.get(username="dana")
    override = IdentityOverride.objects.get(user=dana)  # the demo's launch week
    page = admin_client.get(CALLERS, {"q": f"user:{dana.pk}"})
    assert [(row["id"], row["limit"]) for row in page.context["overrides"]] == [
        (override.pk, "× 2")]  # the demo's launch week doubles her studio-minute
    assert page.context["override_add_url"].endswith(f"/identityoverride/add/?user={dana.pk}")
    response = admin_client.post(CALLERS + "end-override/",
                                 {"ref": f"user:{dana.pk}", "override": override.pk})
    assert response.status_code == 302
    override.refresh_from_db()
    assert override.ends_at <= timezone.now()
    assert admin_client.get(CALLERS, {"q": f"user:{dana.pk}"}).context["overrides"] == []
    # another caller's override is not this caller's to end
    alice = get_user_model().objects.get(username="alice")
    other = IdentityOverride.objects.create(user=alice, exempt=True)
    admin_client.post(CALLERS + "end-override/", {"ref": f"user:{dana.pk}", "override": other.pk})
    other.refresh_from_db()
    assert other.ends_at is None
    # an override without a reason, on alice's own page
    page = admin_client.get(CALLERS, {"q": f"user:{alice.pk}"})
    assert page.status_code == 200
    assert [(row["limit"], row["why"]) for row in page.context["overrides"]] == [("exempt", "")]


def test_links_prefill_the_simulator_and_the_usage_page(admin_client):
    key = ApiKey.objects.get(user__username="bob")
    context = admin_client.get(CALLERS, {"q": f"key:{key.pk}"}).context
    simulator = admin_client.get(context["simulate_url"])
    form = simulator.context["form"]
    assert not form.is_bound and form.initial["api_key"] == str(key.pk)  # prefilled, not run
    assert f'<option value="{key.pk}" selected>' in simulator.content.decode()
    assert f"caller=key%3A{key.pk}" in context["usage"]["url"] or \
        f"caller=key:{key.pk}" in context["usage"]["url"]
    usage = admin_client.get(context["usage"]["url"])
    assert usage.status_code == 200 and usage.context["form"].cleaned_data["caller"] == \
        f"key:{key.pk}"


def test_the_search_finds_by_email_and_key_name_and_the_old_address_redirects(admin_client):
    alice = get_user_model().objects.get(username="alice")
    alice.email = "Alice@Example.com"
    alice.save()
    found = admin_client.get(CALLERS, {"q": "alice@example.com"}, follow=True)
    assert found.context["ref"] == f"user:{alice.pk}"
    assert found.redirect_chain == [(f"{CALLERS}?q=user%3A{alice.pk}", 302)]
    old = admin_client.get("/admin/ratelimit_monitoring/dashboard/inspect/", {"q": "alice"})
    assert old["Location"] == f"{CALLERS}?q=alice"
    # an IPv6 client is its network, and its override is prefilled with the network's address
    network = admin_client.get(CALLERS, {"q": "2001:db8::1"}, follow=True)
    assert network.context["ref"] == "ip:2001:db8::/64"
    assert network.context["override_add_url"].endswith("?ip=2001%3Adb8%3A%3A")


def test_the_api_keys_list_shows_each_keys_plan_and_where_it_comes_from(admin_client):
    html = admin_client.get("/admin/ratelimit_callers/apikey/").content.decode()
    assert "Free <small>(its user&#x27;s)</small>" in html  # the plan's name, not just its source
    key = ApiKey.objects.get(user__username="bob")
    assert f'href="{CALLERS}?q=key%3A{key.pk}"' in html
    assert f'href="{CALLERS}?q=user%3A{key.user_id}"' in html
