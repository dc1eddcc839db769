"""Who is calling: API key, user, tenant, plan, and the proxy-aware client address."""

import tracemalloc

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.test import Client, RequestFactory

from ratelimit_app.decision.identity import client_address, client_ip, identify
from ratelimit_app.decision.keys import scope_token
from ratelimit_app.models import ApiKey, Plan, PlanAssignment, Scope

from ..helpers import limiter, load_demo_data

factory = RequestFactory()


@pytest.fixture
def demo(db):
    load_demo_data()


def user(username):
    return get_user_model().objects.get(username=username)


def who(user=None, **meta):
    """Return the Identity of a GET request with ``meta`` as seen by the current snapshot."""
    request = factory.get("/api/items/", **meta)
    return identify(request, user, limiter().snapshot())


def ratelimit_settings(settings, **changes):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, **changes}


# Resolvers named by dotted path in the tests below.
def tenant_from_header(request):
    return request.META.get("HTTP_X_TENANT")


def plan_from_header(request, identity):
    return request.META.get("HTTP_X_PLAN")


# --- API keys, users, plans, tenants ----------------------------------------------------------

def test_api_key_identifies_its_user_plan_and_tenant(demo):
    carol = user("carol")
    identity = who(HTTP_X_API_KEY="rk_carol_enterprise")
    key = ApiKey.objects.get(user=carol)
    assert (identity.kind, identity.plan, identity.tenant) == ("key", "enterprise", "acme")
    assert identity.user_id == str(carol.pk) and identity.api_key_id == key.id
    assert identity.display == "key rk_carol…"  # the stored prefix, never the key
    assert identity.token_for(Scope.USER) == scope_token("key", key.id)
    assert identity.token_for(Scope.TENANT) == scope_token("tenant", "acme")


def test_api_key_header_name_is_configurable(settings, demo):
    ratelimit_settings(settings, API_KEY_HEADER="Authorization-Key")
    assert who(HTTP_X_API_KEY="rk_bob_pro").kind == "anonymous"
    assert who(HTTP_AUTHORIZATION_KEY="rk_bob_pro").plan == "pro"


def test_key_of_its_own_plan_and_tenant_wins_over_the_users_assignment(demo):
    ApiKey.create_key(user("alice"), "ci", raw_key="rk_alice_ci", plan=Plan.objects.get(slug="pro"),
                      tenant="alice-co")
    limiter().policies.reset()
    identity = who(HTTP_X_API_KEY="rk_alice_ci")
    assert (identity.plan, identity.tenant) == ("pro", "alice-co")


def test_unknown_key_is_an_anonymous_caller_by_ip(demo):
    identity = who(HTTP_X_API_KEY="rk_not_a_key", REMOTE_ADDR="203.0.113.9")
    assert (identity.kind, identity.display, identity.ip) == ("anonymous", "203.0.113.9",
                                                               "203.0.113.9")
    assert identity.plan == "free"  # the default plan for anonymous clients
    assert identity.token_for(Scope.USER) is None
    assert identity.primary_token == scope_token("ip", "203.0.113.9")


def test_inactive_key_is_ignored(demo):
    ApiKey.objects.filter(user=user("bob")).update(active=False)
    limiter().policies.reset()
    assert who(HTTP_X_API_KEY="rk_bob_pro").kind == "anonymous"


def test_ten_kilobyte_key_header_is_ignored_even_if_it_would_match(demo):
    huge = "rk_" + "x" * 10_000
    ApiKey.create_key(user("bob"), "huge", raw_key=huge)
    limiter().policies.reset()
    assert who(HTTP_X_API_KEY=huge).kind == "anonymous"


@pytest.mark.parametrize("value", ["", "\ud800", "{rk_bob_pro}", "rk_bob_pro\x00"])
def test_odd_key_headers_are_anonymous_callers(demo, value):
    assert who(HTTP_X_API_KEY=value).kind == "anonymous"


def test_signed_in_user_gets_the_assigned_plan_and_tenant(demo):
    carol = user("carol")
    identity = who(carol)
    assert (identity.kind, identity.display, identity.plan, identity.tenant) == \
        ("user", "carol", "enterprise", "acme")
    assert identity.token_for(Scope.USER) == scope_token("user", str(carol.pk))


def test_user_without_assignment_gets_the_default_plan_for_signed_in_users(demo):
    dave = get_user_model().objects.create(username="dave")
    identity = who(dave)
    assert (identity.kind, identity.plan, identity.tenant) == ("user", "free", None)
    assert identity.token_for(Scope.TENANT) is None  # tenant rules do not apply


def test_anonymous_user_object_is_anonymous(demo):
    assert who(AnonymousUser()).kind == "anonymous"


def test_key_without_tenant_uses_the_tenant_of_its_users_assignment(demo):
    PlanAssignment.objects.filter(user=user("bob")).update(tenant="initech")
    limiter().policies.reset()
    assert who(HTTP_X_API_KEY="rk_bob_pro").tenant == "initech"


def test_no_default_plans_means_no_plan(db):
    dave = get_user_model().objects.create(username="dave")
    assert who().plan is None
    assert who(dave).plan is None


def test_tenant_resolver_replaces_the_stored_tenant(settings, demo):
    ratelimit_settings(settings, TENANT_RESOLVER="tests.decision.test_identity.tenant_from_header")
    assert who(user("carol"), HTTP_X_TENANT="globex").tenant == "globex"
    assert who(user("carol")).tenant is None  # the resolver said: no tenant
    assert who(HTTP_X_TENANT="globex").tenant == "globex"  # anonymous callers too


def test_plan_resolver_chooses_the_plan_and_none_keeps_the_default(settings, demo):
    ratelimit_settings(settings, PLAN_RESOLVER="tests.decision.test_identity.plan_from_header")
    identity = who(user("alice"), HTTP_X_PLAN="enterprise")
    assert (identity.kind, identity.plan) == ("user", "enterprise")
    assert who(user("alice")).plan == "free"


# --- client address ----------------------------------------------------------------------------

def test_remote_addr_is_the_client_without_trusted_proxies(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=[])
    meta = {"REMOTE_ADDR": "198.51.100.7", "HTTP_X_FORWARDED_FOR": "1.2.3.4"}
    assert client_ip(meta) == "198.51.100.7"  # spoofed X-Forwarded-For ignored


def test_forwarded_for_from_an_untrusted_address_is_ignored(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    assert client_ip({"REMOTE_ADDR": "198.51.100.7",
                      "HTTP_X_FORWARDED_FOR": "10.0.0.5, 1.2.3.4"}) == "198.51.100.7"


def test_forwarded_for_from_a_trusted_proxy_gives_the_hop_it_added(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.1"])
    assert client_ip({"REMOTE_ADDR": "10.0.0.1",
                      "HTTP_X_FORWARDED_FOR": "6.6.6.6, 203.0.113.5"}) == "203.0.113.5"


def test_rightmost_untrusted_hop_through_several_trusted_proxies(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8", "192.168.1.1", "2001:db8::/32"])
    meta = {"REMOTE_ADDR": "10.1.1.1",
            # the client forged the first two entries; our proxies added the rest
            "HTTP_X_FORWARDED_FOR": "10.9.9.9, 6.6.6.6, 203.0.113.5, 192.168.1.1, 2001:db8::1"}
    assert client_ip(meta) == "203.0.113.5"


def test_all_hops_trusted_gives_the_leftmost_proxy(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    assert client_ip({"REMOTE_ADDR": "10.0.0.1",
                      "HTTP_X_FORWARDED_FOR": "10.0.0.3, 10.0.0.2"}) == "10.0.0.3"


@pytest.mark.parametrize("forwarded, expected", [
    # (the client address, whether it stands for the proxy rather than one client)
    ("", ("10.0.0.1", True)),                          # no header: the proxy itself
    ("10.0.0.3, 10.0.0.2", ("10.0.0.3", True)),        # every hop one of our proxies
    ("unknown", ("unknown via 10.0.0.1", True)),       # RFC 7239: the proxy did not know
    ("UNKNOWN:8080", ("unknown via 10.0.0.1", True)),
    ('"unknown"', ("unknown via 10.0.0.1", True)),
    (",,,", ("unknown via 10.0.0.1", True)),           # an empty hop names no one either
    ("unknown, 10.0.0.2", ("unknown via 10.0.0.2", True)),  # under the proxy that wrote it
    ("_hidden", ("_hidden via 10.0.0.1", False)),      # obfuscated: stable per client
    ('"_hidden:_port"', ("_hidden via 10.0.0.1", False)),
    ("_other", ("_other via 10.0.0.1", False)),
    ('"198.51.100.5"', ("198.51.100.5", False)),       # quoted, as RFC 7239 writes a node
    ('"198.51.100.5:4711"', ("198.51.100.5", False)),
    ('"[2001:db8:1:2::1]"', ("2001:db8:1:2::/64", False)),
    ('"2001:db8:1:2::1"', ("2001:db8:1:2::/64", False)),
    ("203.0.113.200:99999", ("203.0.113.200", False)),  # RFC 7239's port is 1 to 5 digits
    ("garbage, 203.0.113.5", ("203.0.113.5", False)),  # forged junk left of the client is harmless
    ("1.2.3.4,\r\n 203.0.113.5", ("203.0.113.5", False)),
    (", ".join(["10.0.0.9"] * 5000) + ", 203.0.113.5", ("203.0.113.5", False)),
])
def test_hop_forms(settings, forwarded, expected):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    assert client_address({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": forwarded}) == \
        expected


@pytest.mark.parametrize("forwarded", [
    "not-an-ip", "203.0.113.5:", "203.0.113.5:http", "203.0.113.5:123456", "[203.0.113.5]",
    "[2001:db8::1", "[2001:db8::1]443", "[" + "1:" * 40 + "]:1", "1.2.3.4\x00", "9" * 10_000,
    "_" + "x" * 40, "1.2.3.4, garbage, 10.0.0.2",
])
def test_hops_that_name_no_client_get_a_bucket_of_their_own_under_their_proxy(settings,
                                                                               forwarded):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    ip, for_proxy = client_address({"REMOTE_ADDR": "10.0.0.1",
                                     "HTTP_X_FORWARDED_FOR": forwarded})
    writer = "10.0.0.2" if forwarded.endswith("10.0.0.2") else "10.0.0.1"
    assert ip.startswith("hop-") and ip.endswith(f" via {writer}") and len(ip) < 40
    assert not for_proxy  # per token: one broken hop is not every client's
    # the same text is the same client; another text another one
    assert client_ip({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": forwarded}) == ip
    assert client_ip({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "other-junk"}) != ip


def test_an_unnamed_hop_is_never_the_address_of_its_proxy(settings, demo):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    proxy = who(REMOTE_ADDR="10.0.0.1")
    for hop in ("unknown", "_hidden", "not-an-ip"):
        forwarded = who(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=hop)
        assert forwarded.token_for(Scope.IP) != proxy.token_for(Scope.IP), hop
    assert proxy.trusted  # the proxy's own address is many callers: never banned
    assert who(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="unknown").trusted
    assert not who(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="_hidden").trusted
    assert not who(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.5").trusted
    assert not who(REMOTE_ADDR="198.51.100.5").trusted


@pytest.mark.parametrize("hop, expected", [
    ("203.0.113.5:5555", "203.0.113.5"),                 # a port tells connections apart
    ("203.0.113.5:_abc-1.x", "203.0.113.5"),             # RFC 7239's obfuscated port
    ("[2001:db8:1:2::1]", "2001:db8:1:2::/64"),
    ("[2001:db8:1:2::1]:443", "2001:db8:1:2::/64"),
    ('"[2001:db8:1:2::1]:443"', "2001:db8:1:2::/64"),    # quoted, as RFC 7239 writes it
    ("[::ffff:203.0.113.5]:80", "203.0.113.5"),
    (" 203.0.113.5:5555 ", "203.0.113.5"),
])
def test_hops_written_as_rfc_7239_nodes_give_their_address(settings, hop, expected):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    meta = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": f"6.6.6.6, {hop}, 10.0.0.7:80"}
    assert client_ip(meta) == expected


def test_two_clients_behind_ported_hops_are_two_clients(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    first, second = ({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": hop}
                     for hop in ("198.51.100.1:40000", "198.51.100.2:40000"))
    assert (client_ip(first), client_ip(second)) == ("198.51.100.1", "198.51.100.2")


def test_a_huge_header_is_split_only_as_far_as_the_last_hops(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    # a million commas left of the hops our proxies added: never split into a million strings
    # (which would take tens of megabytes)
    forwarded = "," * 1_000_000 + "203.0.113.5, 10.0.0.2:8080"
    tracemalloc.start()
    try:
        assert client_ip({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": forwarded}) == \
            "203.0.113.5"
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(forwarded)  # the unsplit remainder, once
    only_proxies = ", ".join(["10.0.0.9"] * 200_000)
    assert client_ip({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": only_proxies}) == \
        "10.0.0.9"  # the walk stops after MAX_FORWARDED_HOPS hops, at a proxy


def test_clients_behind_ported_hops_get_buckets_of_their_own(settings, demo, redis_client):
    ratelimit_settings(settings, TRUSTED_PROXIES=["127.0.0.1"])
    client = Client()
    first = [client.get("/hello/", HTTP_X_FORWARDED_FOR="198.51.100.1:40000").status_code
             for _ in range(41)]  # free-ip: burst 40
    assert first == [200] * 40 + [429]
    for hop, address in (("198.51.100.2:40000", "198.51.100.2"),
                         ("[2001:db8::1]:443", "2001:db8::/64"),
                         ("[2001:db8:0:1::1]", "2001:db8:0:1::/64")):
        response = client.get("/hello/", HTTP_X_FORWARDED_FOR=hop)
        assert response.status_code == 200, hop
        assert response.wsgi_request.ratelimit.identity.ip == address


def test_ipv6_clients_are_grouped_by_prefix(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=[])
    assert client_ip({"REMOTE_ADDR": "2001:db8:1:2:3:4:5:6"}) == "2001:db8:1:2::/64"
    assert client_ip({"REMOTE_ADDR": "2001:db8:1:2:ffff::1"}) == "2001:db8:1:2::/64"
    assert client_ip({"REMOTE_ADDR": "2001:db8:1:3::1"}) == "2001:db8:1:3::/64"
    ratelimit_settings(settings, IPV6_PREFIX_LENGTH=48)
    assert client_ip({"REMOTE_ADDR": "2001:db8:1:2:3:4:5:6"}) == "2001:db8:1::/48"
    ratelimit_settings(settings, IPV6_PREFIX_LENGTH=128)
    assert client_ip({"REMOTE_ADDR": "2001:db8::6"}) == "2001:db8::6/128"


def test_ipv6_zone_ids_do_not_make_new_identities(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=[])
    assert client_ip({"REMOTE_ADDR": "fe80::1%eth0"}) == client_ip({"REMOTE_ADDR": "fe80::1"})


def test_ipv4_mapped_ipv6_is_the_ipv4_address(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=["10.0.0.0/8"])
    assert client_ip({"REMOTE_ADDR": "::ffff:203.0.113.7"}) == "203.0.113.7"
    # a mapped proxy address is trusted like the IPv4 one, a mapped hop is the IPv4 client
    assert client_ip({"REMOTE_ADDR": "::ffff:10.0.0.1",
                      "HTTP_X_FORWARDED_FOR": "::ffff:198.51.100.2"}) == "198.51.100.2"


def test_missing_or_broken_remote_addr(settings):
    assert client_ip({}) == "unknown"
    assert client_ip({"REMOTE_ADDR": "<script>"}) == "unknown"


def test_identity_ip_uses_the_proxy_aware_address(settings, demo):
    ratelimit_settings(settings, TRUSTED_PROXIES=["127.0.0.1"])
    identity = who(REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="2001:db8::1")
    assert (identity.ip, identity.display) == ("2001:db8::/64", "2001:db8::/64")
    assert identity.token_for(Scope.IP) == scope_token("ip", "2001:db8::/64")


# --- D8: request input cannot grow per-process memory -----------------------------------------

def grown_bytes(action, repeat=2000):
    """Return how much more memory Python holds after ``action(i)`` ran ``repeat`` times."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(repeat):
            action(i)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_random_forwarded_for_hops_do_not_grow_memory(settings):
    ratelimit_settings(settings, TRUSTED_PROXIES=["127.0.0.1"])
    junk = "x" * 4000

    def request_with_random_hop(i):
        meta = {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": f"10.1.2.3, {i}{junk}"}
        # the malformed hop stops the walk: a short name of its own under the proxy
        assert client_ip(meta).endswith(" via 127.0.0.1")

    # 2000 distinct 4 kB hops: 8 MB if each were kept
    assert grown_bytes(request_with_random_hop) < 1_000_000


def test_long_tenant_names_are_kept_short_and_distinct(settings, demo):
    ratelimit_settings(settings, TENANT_RESOLVER="tests.decision.test_identity.tenant_from_header")
    first = who(HTTP_X_TENANT="a" * 5000).tenant
    assert len(first) <= 100
    assert first == who(HTTP_X_TENANT="a" * 5000).tenant != who(HTTP_X_TENANT="b" * 5000).tenant
    assert who(HTTP_X_TENANT="globex").tenant == "globex"

    def identify_random_tenant(i):
        who(HTTP_X_TENANT=f"{i}" + "t" * 4000)

    assert grown_bytes(identify_random_tenant, repeat=1000) < 1_000_000


def test_long_scope_values_are_not_memoised():
    junk = "v" * 4000
    assert scope_token("tenant", junk) == scope_token("tenant", junk)
    assert grown_bytes(lambda i: scope_token("tenant", f"{i}{junk}")) < 1_000_000


def test_a_plan_resolver_naming_no_plan_is_ignored(settings, demo):
    ratelimit_settings(settings, PLAN_RESOLVER="tests.decision.test_identity.plan_from_header")
    assert who(user("alice"), HTTP_X_PLAN="no-such-plan").plan == "free"
    assert who(user("alice"), HTTP_X_PLAN="p" * 5000).plan == "free"
