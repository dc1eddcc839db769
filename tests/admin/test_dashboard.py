"""The dashboard in the admin: JSON fed by real traffic, access control, inspector, reset,
Prometheus."""

import io
import re
import time

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.template.loader import render_to_string
from django.test import Client, override_settings

import ratelimit_app.admin.dashboard.admin  # noqa: F401  (registers the dashboard with the admin)
from ratelimit_app.admin.dashboard.charts import count_axis, requests_chart, since_traffic
from ratelimit_app.admin.dashboard.data import dashboard_data
from ratelimit_app.decision.buckets import pack_value
from ratelimit_app.decision.keys import bucket_key, scope_token
from ratelimit_app.models import ApiKey, Rule

from ..helpers import limiter, poll_until

DASHBOARD = "/admin/ratelimit_monitoring/dashboard/"
DATA = DASHBOARD + "data.json"
INSPECT = DASHBOARD + "callers/"  # the caller page (the inspector's old address redirects)
RESET = DASHBOARD + "reset/"
SCRAPER = "198.51.100.7"

pytestmark = pytest.mark.django_db


def config(**extra):
    return override_settings(RATELIMIT_APP={**settings.RATELIMIT_APP, **extra})


def make_user(username, staff=True, perms=()):
    user = get_user_model().objects.create_user(username, password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def signed_in(user, **client_options):
    client = Client(**client_options)
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def demo():
    call_command("load_demo", stdout=io.StringIO())


@pytest.fixture
def admin_client_(demo):
    return signed_in(get_user_model().objects.get(username="admin"))


@pytest.fixture
def traffic(demo):
    """Real requests through the middleware and throttle: an anonymous scraper hammering
    items (free-ip: burst 40), alice's and bob's keys behaving. Returns the 429s seen."""
    api = Client()
    denied = 0
    for _ in range(60):
        denied += api.get("/api/items/", REMOTE_ADDR=SCRAPER).status_code == 429
    for _ in range(5):
        assert api.get("/api/items/", HTTP_X_API_KEY="rk_alice_free").status_code == 200
    for _ in range(3):
        assert api.get("/api/search/", HTTP_X_API_KEY="rk_bob_pro").status_code == 200
    limiter().flusher.flush_now()
    return denied


def test_json_endpoint_reports_real_traffic(admin_client_, traffic):
    assert traffic >= 19  # 40 burst + a little refill out of 60
    data = admin_client_.get(DATA).json()
    assert data["summary"] == {"requests": 68, "allowed": 68 - traffic, "denied": traffic,
                               "shadow": 0, "rate_429": round(100 * traffic / 68, 1),
                               "degraded": 0}
    assert sum(row["denied"] for row in data["series"]) == traffic
    assert sum(row["allowed"] for row in data["series"]) == 68 - traffic
    plans = {row["name"]: row for row in data["rates"]["plan"]}
    assert plans["free"]["denied"] == traffic and plans["free"]["requests"] == 65
    assert plans["pro"] == {"name": "pro", "requests": 3, "denied": 0, "shadow": 0, "rate": 0.0}
    rules = {row["name"]: row for row in data["rates"]["rule"]}
    assert rules["free-ip"]["denied"] == traffic and rules["global"]["denied"] == 0
    endpoints = {row["name"]: row for row in data["rates"]["endpoint"]}
    assert endpoints["api:items"]["denied"] == traffic and endpoints["api:search"]["requests"] == 3
    shadow = {row["name"]: row for row in data["shadow_rules"]}
    assert shadow["search-ip-trial"]["would_deny"] == 0  # bob's key is not an IP client


def test_hot_keys_rank_the_abuser_first_and_never_show_a_secret(admin_client_, traffic):
    data = admin_client_.get(DATA).json()
    top = data["hot_keys"]["denials"][0]
    assert (top["ref"], top["label"], top["plan"], top["denials"]) == (
        f"ip:{SCRAPER}", SCRAPER, "free", traffic)
    assert top["rate"] == round(100 * traffic / 60, 1)
    assert top["inspect_url"] == INSPECT + "?q=ip%3A198.51.100.7"
    by_tokens = {row["label"]: row for row in data["hot_keys"]["tokens"]}
    assert by_tokens["bob · key rk_bob_p…"]["tokens"] == 15  # 3 searches of cost 5
    assert by_tokens["alice · key rk_alice…"]["tokens"] == 5
    body = admin_client_.get(DASHBOARD).content.decode()
    assert "rk_bob_pro" not in body and "rk_bob_pro" not in str(data)


def test_near_limit_lists_the_drained_client(admin_client_, traffic):
    near = admin_client_.get(DATA).json()["near_limit"]
    assert (SCRAPER, "free-ip", 0, 40) in {
        (row["label"], row["rule"], row["remaining"], row["burst"]) for row in near}


def test_dashboard_page_holds_chart_tables_and_health(admin_client_, traffic):
    response = admin_client_.get(DASHBOARD)
    assert response.status_code == 200
    html = response.content.decode()
    bars = re.findall(r'data-allowed="(\d+)" data-denied="(\d+)"', html)
    # the minutes since the traffic began (just now), at least the last 15
    assert len(bars) == 15 and sum(int(d) for _a, d in bars) == traffic
    assert "Requests per minute" in html and "Time (UTC)" in html  # labelled axes
    assert 'rel="icon" href="data:,"' in html
    assert f'data-identity="ip:{SCRAPER}"' in html
    health = response.context["data"]["health"]
    assert health["redis_ok"] and health["breaker"] == "closed"
    assert health["last_flush_age_s"] is not None and health["last_flush_age_s"] < 60
    assert health["config_version"] == limiter().read_version()


def test_json_carries_the_fragments_the_page_swaps_in(admin_client_, traffic):
    data = admin_client_.get(DATA + "?window=5m").json()
    assert data["window"] == "5m"
    # the first screen's (health in one line, the 429 rate, the hottest callers, the bans), then
    # the rest; the two hot-key tables are one ("callers"), the ban log a fragment of its own
    assert list(data["html"]) == ["health_line", "rate_chart", "callers", "bans", "summary",
                                  "chart", "rates", "near_limit", "temporary", "credits",
                                  "ban_log", "health"]
    assert f'data-stat="denied">{traffic}<' in data["html"]["summary"]
    assert admin_client_.get(DATA + "?window=bogus").json()["window"] == "1h"


def test_admin_index_links_to_the_dashboard_for_permitted_staff_only(demo):
    assert DASHBOARD in signed_in(get_user_model().objects.get(username="admin")).get(
        "/admin/").content.decode()
    viewer = make_user("viewer", perms=["view_dashboard"])
    assert DASHBOARD in signed_in(viewer).get("/admin/").content.decode()
    other = make_user("other")
    assert DASHBOARD not in signed_in(other).get("/admin/").content.decode()


@pytest.mark.parametrize("url", [DASHBOARD, DATA, INSPECT + "?q=127.0.0.1"])
def test_anonymous_and_non_staff_users_get_the_admin_login(url):
    for client in (Client(), signed_in(make_user("outsider", staff=False,
                                                 perms=["view_dashboard"]))):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")


@pytest.mark.parametrize("url", [DASHBOARD, DATA, INSPECT + "?q=127.0.0.1"])
def test_staff_without_the_view_permission_get_403(url):
    assert signed_in(make_user("staff")).get(url).status_code == 403


def test_inspector_shows_a_clients_buckets(admin_client_, traffic):
    response = admin_client_.get(INSPECT, {"q": SCRAPER}, follow=True)
    rows = {row["rule"]: row for row in response.context["rows"]}
    assert rows["free-ip"]["tokens"] == 0 and rows["free-ip"]["capacity"] == 40
    assert 0 < rows["free-ip"]["full_in_s"] <= 120
    assert rows["global"]["own"] is False  # shared buckets are shown, marked as such
    assert b'data-rule="free-ip" data-tokens="0" data-capacity="40"' in response.content


def test_inspector_shows_a_credit_balance_beside_the_buckets(admin_client_):
    """A credits rule with no allowance (capacity 0): the inspector shows its units left, as a
    full bar while some are left, and how it refills, without dividing by its capacity."""
    alice_key = ApiKey.objects.get(user__username="alice")
    rule = Rule(name="alice-credits", plan=alice_key.plan or alice_key.user.ratelimit_plan.plan,
                scope="user", kind="credits", rate=0)
    rule.full_clean()
    rule.save()
    limiter().bump_config_version()
    from ratelimit_app.business.credits.ledger import client_of, seed

    seed(client_of(limiter().store), "rl", [f"key:{alice_key.id}"])
    rows = {row["rule"]: row for row in
            admin_client_.get(INSPECT, {"q": f"key:{alice_key.id}"}).context["rows"]}
    assert rows["alice-credits"]["tokens"] == 0 and rows["alice-credits"]["percent"] == 0
    assert rows["alice-credits"]["rate"] == "prepaid credits, 0 included once"


def test_inspector_finds_users_keys_and_explains_ambiguity(admin_client_, traffic):
    alice_key = ApiKey.objects.get(user__username="alice")
    choices = admin_client_.get(INSPECT, {"q": "rk_"}, follow=True).context["lookup"].choices
    assert len(choices) == 5 and ("key:%d" % alice_key.id) in dict(choices)  # the demo's keys
    response = admin_client_.get(INSPECT, {"q": f"key:{alice_key.id}"})
    rows = {row["rule"]: row for row in response.context["rows"]}
    assert rows["free-user"]["tokens"] == 25 and rows["free-user"]["capacity"] == 30
    assert "free-ip" not in rows  # a key's IP buckets depend on where it calls from
    user_rows = admin_client_.get(INSPECT, {"q": "alice"}, follow=True).context["rows"]
    assert {row["rule"] for row in user_rows} >= {"free-user", "free-reports"}
    missing = admin_client_.get(INSPECT, {"q": "{nobody}:x" * 50})
    assert missing.status_code == 200 and b"No caller matches" in missing.content


def test_demo_keys_have_distinct_prefixes_the_inspector_finds(admin_client_):
    from project.demo.management.commands.load_demo import USERS

    keys = ApiKey.objects.select_related("user").order_by("id")
    prefixes = [key.prefix for key in keys]
    assert len(prefixes) == len(USERS) == len(set(prefixes))
    assert prefixes == [raw_key[:ApiKey.PREFIX_LENGTH] for *_, raw_key in USERS]
    for key in keys:
        # what an operator types: the bare prefix, or the dashboard's "key <prefix>…" label
        for query in (key.prefix, f"key {key.prefix}…"):
            lookup = admin_client_.get(INSPECT, {"q": query}, follow=True).context["lookup"]
            assert lookup.choices == [] and lookup.identity.api_key_id == key.id
            assert lookup.label.startswith(f"key {key.prefix}… ({key.user.username} /")


def test_reset_needs_post_csrf_confirmation_and_permission(demo, traffic, redis_client):
    admin_user = get_user_model().objects.get(username="admin")
    client = signed_in(admin_user, enforce_csrf_checks=True)
    assert client.get(RESET).status_code == 405
    assert client.post(RESET, {"ref": f"ip:{SCRAPER}", "confirm": "yes"}).status_code == 403
    page = client.get(INSPECT, {"q": SCRAPER}, follow=True)
    token = page.context["csrf_token"]
    confirm = client.post(RESET, {"ref": f"ip:{SCRAPER}", "csrfmiddlewaretoken": str(token)})
    assert confirm.status_code == 200 and b"Yes, reset" in confirm.content
    assert redis_client.keys(f"rl:{{{scope_token('ip', SCRAPER)}}}*")  # nothing deleted yet

    viewer = signed_in(make_user("viewer", perms=["view_dashboard"]), enforce_csrf_checks=True)
    viewer_token = viewer.get(INSPECT, {"q": SCRAPER}, follow=True).context["csrf_token"]
    assert viewer.post(RESET, {"ref": f"ip:{SCRAPER}", "confirm": "yes",
                               "csrfmiddlewaretoken": str(viewer_token)}).status_code == 403

    plan_rule = Rule.objects.get(name="free-plan")
    shared_key = bucket_key("rl", scope_token("plan", "free"))
    # a shared bucket (no TTL, so it cannot expire)
    redis_client.set(shared_key, pack_value({plan_rule.id: (1, 1, 60000)}))
    version = limiter().read_version()
    done = client.post(RESET, {"ref": f"ip:{SCRAPER}", "confirm": "yes",
                               "csrfmiddlewaretoken": str(token)})
    assert done.status_code == 302 and done["Location"] == INSPECT + "?q=ip%3A198.51.100.7"
    assert redis_client.keys(f"rl:{{{scope_token('ip', SCRAPER)}}}*") == []
    assert redis_client.exists(shared_key)  # shared buckets stay
    assert limiter().read_version() != version  # workers drop stale local denials
    entry = LogEntry.objects.get()
    assert entry.user == admin_user and entry.object_repr == f"buckets of IP {SCRAPER}"
    rows = client.get(INSPECT, {"q": SCRAPER}, follow=True).context["rows"]
    assert {row["rule"]: row["tokens"] for row in rows}["free-ip"] == 40
    assert Client().get("/api/items/", REMOTE_ADDR=SCRAPER).status_code == 200  # it may call again


def test_dashboard_survives_redis_being_down(admin_client_, redis_server):
    redis_server.kill()
    try:
        response = admin_client_.get(DASHBOARD)
        data = admin_client_.get(DATA).json()
    finally:
        redis_server.start()
    assert response.status_code == 200 and b"unavailable" in response.content
    assert data["health"]["redis_ok"] is False and data["summary"]["requests"] == 0


def test_d6_decisions_made_while_redis_was_down_reach_the_dashboard_and_prometheus(
        admin_client_, redis_server):
    with config(BREAKER_COOLDOWN_S=0.2, PROMETHEUS_ENABLED=True):
        redis_server.kill()
        try:
            for _ in range(5):  # fail-open: allowed without Redis
                assert Client().get("/api/items/", REMOTE_ADDR=SCRAPER).status_code == 200
            assert limiter().flusher.flush_now() == 0
            down = admin_client_.get(DATA).json()
        finally:
            redis_server.start()
        assert down["health"]["flush_state"] == "failing"
        assert down["health"]["buffered_decisions"] == 5
        assert "failing since" in down["html"]["health"] and "5 decisions buffered" in \
            down["html"]["health"]
        poll_until(lambda: limiter().flusher.flush_now() > 0)  # once the breaker lets it try
        data = admin_client_.get(DATA).json()
        scrape = admin_client_.get("/ratelimit/metrics/").content.decode()
    assert data["summary"]["requests"] == 5 and data["summary"]["allowed"] == 5
    assert sum(row["allowed"] for row in data["series"]) == 5
    [period] = data["health"]["buffered_periods"]
    assert period["decisions"] == 5 and period["from"] <= period["to"]
    assert data["health"]["flush_state"] == "ok" and data["health"]["buffered_decisions"] == 0
    assert f"{period['from_text']} to {period['to_text']}: 5 decisions counted late" in \
        data["html"]["health"]
    assert 'ratelimit_decisions_total{dimension="all",name="",outcome="allowed"} 5.0' in scrape
    assert "ratelimit_metrics_buffered_decisions 0.0" in scrape


@pytest.mark.parametrize("count, noun", [(1, "decision"), (2, "decisions")])
def test_health_counts_are_pluralised(count, noun):
    period = {"from": 0, "to": 60, "from_text": "12:00", "to_text": "12:01",
              "decisions": count, "dropped": 0}
    failing = render_to_string("ratelimit_app/dashboard_health.html", {"health": {
        "flush_state": "failing", "buffered_decisions": count, "dropped": count,
        "buffered_periods": [period]}})
    late = render_to_string("ratelimit_app/dashboard_health.html", {"health": {
        "flush_state": "late", "buffered_decisions": count, "pending_age_s": 3}})
    assert f": {count} {noun} buffered, written when Redis answers" in failing
    assert f"({count} {noun} dropped: buffered for more than an hour)" in failing
    assert f"12:00 to 12:01: {count} {noun} counted late" in failing
    assert f"late</span>: {count} {noun} waiting 3 s for a flush" in late


def flush_line(data):
    html = data["html"]["health"]
    return re.search(r'<dd data-health-field="flush".*?</dd>', html, re.S).group(0)


def test_no_traffic_is_shown_as_idle_not_as_a_failing_flush(admin_client_, traffic, redis_server):
    later = time.time() + 43  # 43 s without a single request
    idle = dashboard_data(now=later)
    assert idle["health"]["flush_state"] == "idle" and idle["health"]["last_flush_age_s"] >= 43
    assert "rl-bad" not in flush_line(idle) and "idle" in flush_line(idle)
    assert dashboard_data()["health"]["flush_state"] == "ok"
    # counted but never flushed (no flush thread): that is a warning
    Client().get("/api/items/", REMOTE_ADDR="192.0.2.1")
    late = dashboard_data(now=later)
    assert late["health"]["flush_state"] == "late" and "rl-bad" in flush_line(late)
    redis_server.kill()
    try:
        limiter().flusher.flush_now()
        failing = dashboard_data()
    finally:
        redis_server.start()
    assert failing["health"]["flush_state"] == "failing" and "rl-bad" in flush_line(failing)


def test_prometheus_endpoint_is_off_by_default_and_guarded(demo, traffic):
    assert Client().get("/ratelimit/metrics/").status_code == 404
    with config(PROMETHEUS_ENABLED=True, PROMETHEUS_TOKEN="s3cret"):
        assert Client().get("/ratelimit/metrics/").status_code == 403
        scrape = Client().get("/ratelimit/metrics/", HTTP_AUTHORIZATION="Bearer s3cret")
        staff = signed_in(get_user_model().objects.get(username="admin")).get("/ratelimit/metrics/")
    assert scrape.status_code == 200 and staff.status_code == 200
    text = scrape.content.decode()
    assert (f'ratelimit_decisions_total{{dimension="rule",name="free-ip",outcome="denied"}} '
            f'{float(traffic)}') in text
    assert 'ratelimit_decisions_total{dimension="plan",name="pro",outcome="allowed"} 3.0' in text
    assert 'ratelimit_breaker_state{state="closed"} 1.0' in text
    assert "ratelimit_process_redis_errors" in text


@pytest.mark.parametrize("busiest", [0, 1, 3, 5, 6, 7, 11, 13, 26, 99, 101, 333, 4001])
def test_count_chart_ticks_are_whole_numbers(busiest):
    """Counts need integer ticks: a busiest minute of 5 used to give 0, 1.25, 2.5, 3.75, 5."""
    series = [{"minute": 60 * i, "allowed": 0, "denied": 0} for i in range(59)]
    series.append({"minute": 60 * 59, "allowed": busiest - busiest // 3, "denied": busiest // 3})
    svg = str(requests_chart(series))
    labels = re.findall(r'<text class="rl-tick" x="\d+" y="[\d.]+" text-anchor="end">([^<]*)<',
                        svg)
    values = [int(label) for label in labels]  # raises on "1.25"
    assert values[0] == 0 and len(values) == 5 and values[-1] >= busiest
    steps = {b - a for a, b in zip(values, values[1:])}
    assert len(steps) == 1 and steps.pop() >= 1  # evenly spaced whole steps


def test_the_requests_chart_starts_where_the_traffic_began_showing_at_least_15_minutes():
    """Light traffic in the last minutes is spread over the chart, not one bar at its edge."""
    def bars(busy_minutes):
        series = [{"minute": 60 * i, "allowed": int(i in busy_minutes), "denied": 0}
                  for i in range(60)]
        return re.findall(r'data-minute="[^"]*" data-allowed="(\d+)"', str(requests_chart(series)))

    assert len(bars({59})) == 15  # traffic only now: the last 15 minutes
    assert len(bars({40, 59})) == 20  # from the first busy minute
    assert len(bars({3})) == 57 and bars({3})[0] == "1"
    assert len(bars(set())) == 15  # no traffic at all: an empty quarter hour
    assert len(since_traffic([{"allowed": 0, "denied": 1}] * 5)) == 5  # a short series whole


def test_count_axis_tops_stay_close_to_the_busiest_minute():
    assert [count_axis(v) for v in (0, 5, 11, 24, 99, 101, 4000)] == [
        (4, 1), (8, 2), (20, 5), (40, 10), (100, 25), (200, 50), (4000, 1000)]


def test_the_accounts_with_the_fewest_credits_are_listed_live_with_their_last_top_up(
        admin_client_):
    from django.test import TestCase

    from ratelimit_app.business.credits.ledger import client_of, top_up
    from ratelimit_app.decision.balances import BalanceState, account_key
    from ratelimit_app.models import CreditAccount, CreditTopUp

    CreditTopUp.objects.all().delete()  # (the demo's prepaid key)
    CreditAccount.objects.all().delete()
    assert dashboard_data()["credits"] == []  # credits not used: no card
    keys = {name: ApiKey.objects.get(user__username=name) for name in ("alice", "bob")}
    with TestCase.captureOnCommitCallbacks(execute=True):
        for units, name in ((50, "alice"), (8, "bob")):
            top_up(f"key:{keys[name].pk}", units, f"pay-{name}", actor="test",
                   client=client_of(limiter().store))
    # alice spent 45 since (live in Redis; the last checkpoint still says 50 left)
    client = limiter().store.metrics_client()
    client.set(account_key("rl", f"key:{keys['alice'].pk}"), BalanceState(50, 45).pack())
    rows = dashboard_data()["credits"]
    assert [(row["prepaid_left"], row["last_top_up"], row["live"]) for row in rows] == \
        [(5, 50, True), (8, 8, True)]
    page = admin_client_.get(DASHBOARD).content.decode()
    assert "Prepaid credits running lowest" in page and rows[0]["url"] in page


def test_the_admins_own_requests_are_neither_limited_nor_counted(admin_client_):
    """A staff session on the admin (the dashboard and its polling included) is no caller: no
    rate-limit headers, nothing counted, no hot key, even where EXEMPT_PATHS does not name
    the admin; nor is the browser's own /favicon.ico."""
    with config(EXEMPT_PATHS=["/health"]):
        for path in ("/admin/", "/admin", DASHBOARD, DATA, INSPECT + "?q=admin",
                     "/admin/ratelimit_app/rule/", "/admin/no-such-page/"):
            response = admin_client_.get(path)
            assert response.status_code in (200, 301, 302, 404), path
            assert "RateLimit-Policy" not in response, path
        assert limiter().recorder.counts() == {}
        assert admin_client_.get("/api/items/").status_code == 200  # the API still is
        limiter().flusher.flush_now()
        assert [row["display"] for row in limiter().reader.hot_keys("1h")["tokens"]] == ["admin"]
    assert "RateLimit-Policy" not in admin_client_.get("/favicon.ico")


def test_the_admin_is_found_wherever_the_urlconf_mounts_it():
    from django.contrib import admin
    from django.urls import URLResolver, include, path
    from django.urls.resolvers import RegexPattern

    from ratelimit_app.config.endpoints import admin_roots

    def urls(*patterns):
        return URLResolver(RegexPattern(r"^/"), list(patterns))

    assert admin_roots(urls(path("admin/", admin.site.urls))) == ["/admin"]
    assert admin_roots(urls(path("api/", include([])), path("backoffice/", include(
        [path("staff/", admin.site.urls)])))) == ["/backoffice/staff"]
    # at the site's root, or under a parameter, its paths cannot be told from the API's
    assert admin_roots(urls(path("", admin.site.urls))) == []
    assert admin_roots(urls(path("<slug:tenant>/admin/", admin.site.urls))) == []
