"""The “what would this request do” simulator: right buckets, levels and cost, and no debit."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from django.contrib import admin

from ratelimit_app.admin.config import RuleAdmin
from ratelimit_app.admin.simulator import simulate
from ratelimit_app.decision.balances import account_key
from ratelimit_app.models import ApiKey, Counts, CreditAccount, IdentityOverride, Rule
from tests.helpers import decide, limiter, load_demo_data

pytestmark = pytest.mark.django_db

NOW_MS = 1_700_000_000_000
IP = "203.0.113.7"
SIMULATOR_URL = "/admin/ratelimit_monitoring/simulator/"


@pytest.fixture
def demo():
    load_demo_data()
    # the quotas alone; the failed-auth gate has its own test below
    Rule.objects.filter(counts=Counts.FAILED_AUTH).delete()
    limiter().policies.reset()  # the rows were written after this test's first snapshot could exist


def test_the_failed_auth_gate_is_shown_with_what_is_left(db):
    load_demo_data()
    limiter().policies.reset()
    result = simulate(endpoint="api:items", method="GET", ip=IP, now_ms=NOW_MS)
    gate = buckets_of(result)["auth-failures"]
    assert gate == (10, 1, False)  # 10 failures left; a request needs one left to pass
    assert result.allowed


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def user(name):
    return get_user_model().objects.get(username=name)


def demo_key(username):
    return ApiKey.objects.get(user__username=username, name="demo")


def buckets_of(result):
    """{rule name: (tokens now, cost of this request, short?)} in the order charged."""
    return {b.name: (b.tokens, b.cost, b.short) for b in result.buckets}


def real_request(rf, endpoint, method="GET", username=None, api_key=None, ip=IP):
    """Send one real (debiting) decision through the engine, as the adapters do."""
    headers = {"HTTP_X_API_KEY": api_key} if api_key else {}
    request = rf.generic(method, "/", REMOTE_ADDR=ip, **headers)
    return decide(request, user(username) if username else None, endpoint,
                                now_ms=NOW_MS)


def redis_contents(client):
    return {key: client.get(key) for key in client.keys("*")}


def pin_keys(client):
    """Drop the keys' TTLs: they run on real time, and a fast bucket (the global one refills 20
    tokens in 40 ms) could expire between a frozen-clock request and the simulation."""
    for key in client.keys("*"):
        client.persist(key)


# --- the simulation --------------------------------------------------------------------------

def test_signed_in_user_sees_every_bucket_full_with_the_endpoint_cost(demo):
    result = simulate(endpoint="api:search", method="GET", ip=IP, user=user("alice"),
                      now_ms=NOW_MS)
    assert (result.identity.kind, result.identity.plan, result.cost) == ("user", "free", 5)
    assert buckets_of(result) == {
        "global": (1000, 5, False),
        "free-plan": (3000, 5, False),
        "free-ip": (40, 5, False),
        "free-user": (30, 5, False),
        "search-ip-trial": (10, 1, False),  # an endpoint rule: one token per call
    }
    search_trial = result.buckets[-1]
    assert (search_trial.shadow, search_trial.describe) == \
        (True, "10 requests to api:search per minute, bursts up to 10")
    assert result.allowed and not result.denied_by


def test_anonymous_caller_gets_the_anonymous_plan_and_no_user_bucket(demo):
    result = simulate(endpoint="api:items", method="GET", ip=IP, now_ms=NOW_MS)
    assert (result.identity.kind, result.identity.plan) == ("anonymous", "free")
    assert list(buckets_of(result)) == ["global", "free-plan", "free-ip"]
    assert result.cost == 1


def test_api_key_is_limited_like_a_real_request_carrying_it(demo, rf, redis_client):
    real_request(rf, "api:reports", "POST", api_key="rk_carol_enterprise")
    pin_keys(redis_client)
    result = simulate(endpoint="api:reports", method="POST", ip=IP,
                      api_key=demo_key("carol"), now_ms=NOW_MS)
    assert (result.identity.kind, result.identity.plan, result.identity.tenant) == \
        ("key", "enterprise", "acme")
    assert buckets_of(result) == {  # the real request's debit is seen in the same buckets
        "global": (980, 20, False),
        "enterprise-tenant": (2980, 20, False),
        "enterprise-user": (980, 20, False),
    }


def test_levels_after_real_requests_and_a_predicted_denial(demo, rf, redis_client):
    real_request(rf, "api:reports", "POST", username="alice")
    pin_keys(redis_client)
    result = simulate(endpoint="api:reports", method="POST", ip=IP, user=user("alice"),
                      now_ms=NOW_MS)
    assert buckets_of(result) == {
        "global": (980, 20, False),
        "free-plan": (2980, 20, False),
        "free-ip": (20, 20, False),
        "free-user": (10, 20, True),
        "free-reports": (4, 1, False),
    }
    assert not result.allowed
    assert result.denied_by == ("free-user",)
    assert result.retry_after_s == 10  # 10 tokens missing at 1 token per second
    later = simulate(endpoint="api:reports", method="POST", ip=IP, user=user("alice"),
                     now_ms=NOW_MS + 10_000)
    assert later.allowed and buckets_of(later)["free-user"] == (20, 20, False)


def test_simulating_debits_nothing(demo, rf, redis_client, redis_server):
    real_request(rf, "api:search", username="alice")
    real_request(rf, "api:reports", "POST", username="alice")
    real_request(rf, "api:items", api_key="rk_bob_pro")
    pin_keys(redis_client)
    before, sets_before = redis_contents(redis_client), redis_server.command_calls("set")
    calls_before = redis_server.command_calls("evalsha")
    for now_ms in (NOW_MS, NOW_MS + 5_000, NOW_MS + 3_600_000):
        simulate(endpoint="api:search", ip=IP, user=user("alice"), now_ms=now_ms)
        simulate(endpoint="api:reports", method="POST", ip=IP, user=user("alice"), now_ms=now_ms)
        simulate(endpoint="api:items", ip=IP, api_key=demo_key("bob"), now_ms=now_ms)
        simulate(endpoint="hello", ip="198.51.100.1", now_ms=now_ms)
    assert redis_contents(redis_client) == before
    assert redis_server.command_calls("set") == sets_before
    assert redis_server.command_calls("evalsha") - calls_before == 12  # one per simulation


def test_a_real_request_after_simulations_still_sees_the_full_bucket(demo, rf, redis_client):
    for _ in range(10):
        assert simulate(endpoint="api:search", ip=IP, user=user("alice"), now_ms=NOW_MS).allowed
    assert redis_client.dbsize() == 0  # not even a key was created
    decision = real_request(rf, "api:search", username="alice")
    remaining = {p.name: p.remaining for p in decision.policies}
    assert remaining == {"global": 995, "free-plan": 2995, "free-ip": 35, "free-user": 25,
                         "search-ip-trial": 9}


def test_exempt_caller_is_reported_as_never_limited(demo):
    IdentityOverride.objects.create(user=user("bob"), exempt=True)
    limiter().policies.reset()
    result = simulate(endpoint="api:search", ip=IP, user=user("bob"), now_ms=NOW_MS)
    assert result.exempt and result.allowed and result.buckets == ()


def test_identity_override_numbers_are_shown_as_such(demo):
    IdentityOverride.objects.create(user=user("alice"), rule=Rule.objects.get(name="free-user"),
                                    rate=600, period_s=60, burst=300)
    limiter().policies.reset()
    result = simulate(endpoint="api:items", ip=IP, user=user("alice"), now_ms=NOW_MS)
    free_user = next(b for b in result.buckets if b.name == "free-user")
    assert (free_user.describe, free_user.overridden, free_user.tokens) == \
        ("600 requests per minute, bursts up to 300", True, 300)


def test_inactive_api_key_is_limited_as_no_key(demo):
    key = demo_key("bob")
    key.active = False
    key.save()
    limiter().policies.reset()
    result = simulate(endpoint="api:items", ip=IP, api_key=key, now_ms=NOW_MS)
    assert result.identity.kind == "anonymous"
    note = f"The key {key.prefix}… is not active: requests carrying it are limited as if they "
    assert result.notes == (note + "had no key.",)


def test_endpoint_without_rules_is_reported_unlimited():
    result = simulate(endpoint="hello", ip=IP, now_ms=NOW_MS)
    assert result.allowed and result.buckets == ()
    assert result.notes == ("No rule applies to this request: it is not limited.",)


def test_redis_down_reports_the_failure_behaviour_without_raising(demo, redis_server):
    Rule.objects.filter(name="free-user").update(on_redis_failure="closed")
    limiter().policies.reset()
    limiter().snapshot()
    redis_server.kill()
    result = simulate(endpoint="api:items", ip=IP, user=user("alice"))
    assert result.redis_error
    assert [b.tokens for b in result.buckets] == [None] * 4
    assert not result.allowed  # free-user refuses requests while Redis is down
    anonymous = simulate(endpoint="api:items", ip=IP)
    assert anonymous.allowed  # every rule of an anonymous caller fails open


def test_a_prepaid_balance_is_shown_as_the_units_it_has_left(demo, redis_client, admin_client):
    erin = demo_key("erin")
    result = simulate(endpoint="api:items", ip=IP, api_key=erin, now_ms=NOW_MS)
    credits = {b.name: b for b in result.buckets}["prepaid-credits"]
    # the trial allowance (20) and the welcome top-up (100); set from the ledger, as a first
    # request would set it, and nothing debited
    assert (credits.tokens, credits.short, result.allowed) == (120, False, True)
    assert credits.describe == "20 units included once, then prepaid credits"
    CreditAccount.objects.filter(ref=f"key:{erin.pk}").update(spent=100, used=20)
    redis_client.delete(account_key("rl", f"key:{erin.pk}"))  # set again from the row
    spent = simulate(endpoint="api:items", ip=IP, api_key=erin, now_ms=NOW_MS)
    assert not spent.allowed and spent.denied_by == ("prepaid-credits",)
    response = admin_client.get(SIMULATOR_URL, {"api_key": erin.prefix, "ip": IP,
                                                "endpoint": "api:items", "method": "GET"})
    html = response.content.decode()
    assert "0 units left" in html and "refused 402, the credits ran out" in html


# --- the admin page --------------------------------------------------------------------------

def test_page_shows_buckets_tokens_cost_and_verdict(demo, admin_client):
    response = admin_client.get(SIMULATOR_URL, {"user": "alice", "ip": IP,
                                                "endpoint": "api:search", "method": "GET"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-rule="free-user"' in html and 'data-rule="search-ip-trial"' in html
    assert "30 / 30" in html and '<strong id="request-cost">5</strong>' in html
    assert "Allowed: every enforced bucket holds the cost." in html
    assert response.context["result"].buckets[0].name == "global"


def test_the_simulator_words_each_limit_as_the_rules_list_does(demo, admin_client):
    result = simulate(endpoint="api:search", method="GET", ip=IP, user=user("alice"),
                      now_ms=NOW_MS)
    assert len(result.buckets) == 5
    listed = RuleAdmin(Rule, admin.site)
    for bucket in result.buckets:
        assert bucket.describe == listed.limit_cell(Rule.objects.get(name=bucket.name))
    html = admin_client.get(SIMULATOR_URL, {"user": "alice", "ip": IP, "endpoint": "api:search",
                                            "method": "GET"}).content.decode()
    assert "<td>10 requests to api:search per minute, bursts up to 10</td>" in html


def test_a_caller_is_picked_by_search_or_named_by_its_keys_prefix_never_listed_whole(
        demo, admin_client):
    """The user and key pickers are Django's autocomplete (the overrides' form's): the page
    lists no key; a link or bookmark may still name the key by prefix or whole key, or the
    user by name, and the picker shows it chosen."""
    carol = demo_key("carol")
    for given in (str(carol.pk), carol.prefix, f"{carol.prefix}…", "rk_carol_enterprise"):
        response = admin_client.get(SIMULATOR_URL, {"api_key": given, "ip": IP,
                                                    "endpoint": "api:reports", "method": "POST"})
        assert response.context["form"].errors == {}, given
        assert response.context["result"].identity.kind == "key", given
        assert response.context["result"].identity.plan == "enterprise", given
        assert re.search(rf'<option value="{carol.pk}" selected>[^<]*</option>',
                         response.content.decode()), given
    html = admin_client.get(SIMULATOR_URL).content.decode()
    picker = re.search(r'<select name="api_key".*?</select>', html, re.S).group(0)
    assert "admin-autocomplete" in picker and 'data-field-name="api_key"' in picker
    assert re.findall(r"<option[^>]*>", picker) == ['<option value="">']  # no key listed
    assert carol.prefix not in html
    alice = user("alice")
    response = admin_client.get(SIMULATOR_URL, {"user": "alice"})  # the caller page's link
    assert f'<option value="{alice.pk}" selected>alice</option>' in response.content.decode()


def test_page_without_a_query_shows_the_empty_form(admin_client):
    response = admin_client.get(SIMULATOR_URL)
    assert response.status_code == 200
    assert response.context["result"] is None and not response.context["form"].is_bound
    assert b'<option value="api:items">' in response.content


@pytest.mark.parametrize("query, errors", [
    ({"ip": "999.1.1.1", "endpoint": "api:items"},
     {"ip": ["Enter a valid IPv4 or IPv6 address."]}),
    ({"ip": IP, "endpoint": "api:nope"},
     {"endpoint": [("“api:nope” is not an endpoint of this project: pick one from the list "
                    "(the URL names of the URLconf).")]}),
    ({"ip": IP, "endpoint": "api:items", "user": "zed"}, {"user": ["No user named “zed”."]}),
    ({"ip": IP, "endpoint": "api:items", "api_key": "rk_nope"},
     {"api_key": [("No API key starts with “rk_nope”: type the prefix the API keys list "
                   "shows, or the whole key.")]}),
    ({"ip": "", "endpoint": ""},
     {"ip": ["This field is required."], "endpoint": ["This field is required."]}),
])
def test_bad_input_gets_a_form_error_not_a_500(admin_client, query, errors):
    response = admin_client.get(SIMULATOR_URL, {"method": "GET", **query})
    assert response.status_code == 200
    assert response.context["form"].errors == errors
    assert response.context["result"] is None


def test_user_and_key_together_are_refused(demo, admin_client):
    response = admin_client.get(SIMULATOR_URL, {
        "user": "alice", "api_key": demo_key("bob").prefix, "ip": IP, "endpoint": "api:items",
        "method": "GET"})
    assert response.context["form"].non_field_errors() == [
        "Choose a user or an API key, not both: a request with a key is limited as the key."]


def test_page_with_redis_down_explains_instead_of_failing(demo, admin_client, redis_server):
    admin_client.get(SIMULATOR_URL)  # sign-in and snapshot work while Redis is up
    redis_server.kill()
    response = admin_client.get(SIMULATOR_URL, {"user": "alice", "ip": IP,
                                                "endpoint": "api:items", "method": "GET"})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Redis is unavailable" in html
    assert "so this request would be\n          <strong>allowed</strong>" in html


def test_anonymous_visitor_is_sent_to_the_login_page(client):
    response = client.get(SIMULATOR_URL)
    assert response.status_code == 302
    assert response["Location"] == f"/admin/login/?next={SIMULATOR_URL}"


def test_non_staff_user_is_sent_to_the_login_page(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("mallory"))
    response = client.get(SIMULATOR_URL)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_staff_needs_the_rule_view_permission(client, django_user_model):
    staff = django_user_model.objects.create_user("sam", is_staff=True)
    client.force_login(staff)
    assert client.get(SIMULATOR_URL).status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_rule"))
    assert client.get(SIMULATOR_URL).status_code == 200


def test_the_simulator_shows_when_a_list_entry_decides(demo, admin_client, redis_client):
    from ratelimit_app.models import AccessListEntry

    AccessListEntry.objects.create(kind="deny", target="ip", value="203.0.113.0/24",
                                   reason="abuse from this network")
    trusted = AccessListEntry.objects.create(kind="allow", target="user_agent",
                                             value="uptime-probe", reason="our monitoring")
    limiter().policies.reset()
    denied = simulate(endpoint="api:items", ip=IP, now_ms=NOW_MS)
    assert denied.denied_by_list and not denied.allowed and not denied.buckets
    assert denied.listed.reason == "abuse from this network"
    marked = simulate(endpoint="api:items", ip="198.51.100.3", user_agent="Uptime-Probe/2",
                      now_ms=NOW_MS)
    assert marked.allowed and marked.identity.trusted and marked.buckets
    assert "Trusted by an allow-list entry" in " ".join(marked.notes)
    AccessListEntry.objects.filter(pk=trusted.pk).update(exempt=True)
    limiter().policies.reset()
    exempt = simulate(endpoint="api:items", ip="198.51.100.3", user_agent="uptime-probe",
                      now_ms=NOW_MS)
    assert exempt.allowed and exempt.exempt and not exempt.buckets and exempt.listed
    assert not redis_client.keys("rl:{*")  # nothing was read into existence
    page = admin_client.get(SIMULATOR_URL, {"endpoint": "api:items", "method": "GET",
                                            "ip": IP}).content.decode()
    assert "Denied (403) by" in page and "abuse from this network" in page
    assert f'/admin/ratelimit_protection/accesslistentry/{denied.listed.id}/change/' in page
