"""Allow-listed ("trusted") callers (issue 50 §3): the penalty box never bans them and the
failed-authentication gate never locks them out, while the same traffic from any other address
is banned or locked out."""

import pytest
from django.test import Client, override_settings

from ratelimit_app.models import AccessListEntry, BanRule, Ban, Counts, Rule, Scope

from ..helpers import limiter, load_demo_data, use_fake_clock

pytestmark = pytest.mark.django_db

THRESHOLD = 3
TRUSTED_NETWORK, TRUSTED_IP, OTHER_IP = "198.51.100.0/24", "198.51.100.9", "192.0.2.1"


def trust_network():
    AccessListEntry.objects.create(kind="allow", target="ip", value=TRUSTED_NETWORK,
                                   reason="our monitoring")
    limiter().policies.reset()


def evalsha_calls(redis_client):
    return redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)


@pytest.fixture
def scraper_rule():
    load_demo_data()
    BanRule.objects.create(name="scrapers", scope="ip", events="statuses", statuses="404",
                           threshold=THRESHOLD, window_s=60, ban_s=600)
    use_fake_clock()
    trust_network()


def test_a_trusted_network_walking_404s_is_never_banned_and_costs_no_ban_call(
        scraper_rule, redis_client):
    trusted = Client(REMOTE_ADDR=TRUSTED_IP)
    assert trusted.get("/hello/").status_code == 200  # (scripts loaded, snapshot compiled)
    before = evalsha_calls(redis_client)
    for i in range(THRESHOLD * 4):
        assert trusted.get(f"/no-such-page-{i}/").status_code == 404
    # one take.lua call per request, none to ban.lua
    assert evalsha_calls(redis_client) - before == THRESHOLD * 4
    assert trusted.get("/hello/").status_code == 200
    limiter().protection.ban_log.drain()  # what its thread does, off in unit tests
    assert not Ban.objects.exists()
    # the same walk from an address no entry names: each 404 counted, then banned
    other = Client(REMOTE_ADDR=OTHER_IP)
    assert other.get("/hello/").status_code == 200
    assert other.get("/no-such-page-0/").status_code == 404  # (ban.lua loaded)
    before = evalsha_calls(redis_client)
    assert other.get("/no-such-page-1/").status_code == 404
    assert evalsha_calls(redis_client) - before == 2  # take.lua, then ban.lua's count
    for i in range(THRESHOLD - 2):
        other.get(f"/no-such-page-{i}/")
    assert other.get("/hello/").status_code == 429
    limiter().protection.ban_log.drain()
    assert [ban.who for ban in Ban.objects.all()] == [OTHER_IP]


def test_a_ban_from_before_the_entry_no_longer_refuses_the_trusted(scraper_rule):
    AccessListEntry.objects.all().delete()
    limiter().policies.reset()
    client = Client(REMOTE_ADDR=TRUSTED_IP)
    for i in range(THRESHOLD):
        client.get(f"/no-such-page-{i}/")
    assert client.get("/hello/").status_code == 429
    trust_network()
    assert client.get("/hello/").status_code == 200  # no ban is checked for a trusted caller


BURST = 3


@pytest.fixture
def failed_auth_rule():
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        load_demo_data()
        Rule.objects.filter(counts=Counts.FAILED_AUTH).delete()
        Rule.objects.create(name="auth-failures", scope=Scope.IP, counts=Counts.FAILED_AUTH,
                            rate=1, period_s=60, burst=BURST)
        use_fake_clock()
        trust_network()
        yield


@pytest.mark.parametrize("ip, locked_out", [(TRUSTED_IP, False), (OTHER_IP, True)])
def test_a_trusted_address_sending_wrong_keys_is_not_locked_out(failed_auth_rule, ip,
                                                                 locked_out):
    client = Client(REMOTE_ADDR=ip)
    for i in range(BURST * 3 if not locked_out else BURST):
        assert client.get("/api/items/", HTTP_X_API_KEY=f"rk_guess_{i}").status_code == 200
    wrong = client.get("/api/items/", HTTP_X_API_KEY="rk_guess_x")
    right = client.get("/hello/", HTTP_X_API_KEY="rk_alice_free")
    assert (wrong.status_code, right.status_code) == ((429, 429) if locked_out else (200, 200))
    charged = limiter().protection.failed_authentication(
        client.get("/hello/").wsgi_request, "hello", charge=False)
    assert (charged is None) == (not locked_out)


# --- a trusted proxy (issue 56): its own address, and the clients it cannot name ----------------

PROXY = "10.0.0.1"


@pytest.fixture
def behind_proxy(settings, scraper_rule):
    AccessListEntry.objects.all().delete()
    limiter().policies.reset()
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "TRUSTED_PROXIES": ["10.0.0.0/8"]}


def test_a_trusted_proxys_own_address_is_never_banned(behind_proxy):
    proxy = Client(REMOTE_ADDR=PROXY)  # its health checks: no X-Forwarded-For
    for i in range(THRESHOLD * 2):
        assert proxy.get(f"/no-such-page-{i}/").status_code == 404
    assert proxy.get("/hello/").status_code == 200
    # nor as the last of a chain of proxies
    chained = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="10.0.0.2")
    for i in range(THRESHOLD * 2):
        chained.get(f"/no-such-page-{i}/")
    assert chained.get("/hello/").status_code == 200
    limiter().protection.ban_log.drain()
    assert not Ban.objects.exists()


@pytest.mark.parametrize("hop", ["unknown", "_hidden", "not-an-address", '"198.51.100.5"'])
def test_a_forwarded_client_without_an_address_never_shares_the_proxys_ban(behind_proxy, hop):
    client = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=hop)
    for i in range(THRESHOLD * 2):
        client.get(f"/no-such-page-{i}/")
    limiter().protection.ban_log.drain()  # what its thread does, off in unit tests
    bans = list(Ban.objects.values_list("who", flat=True))
    # the proxy's other clients and the proxy itself pass
    assert Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="198.51.100.77").get(
        "/hello/").status_code == 200
    assert Client(REMOTE_ADDR=PROXY).get("/hello/").status_code == 200
    if hop == "unknown":
        # the clients the proxy could not name are many callers, as the proxy's own address is
        assert bans == [] and client.get("/hello/").status_code == 200
    else:
        # a client the proxy named (obfuscated, broken or quoted) is banned alone
        assert client.get("/hello/").status_code == 429
        assert len(bans) == 1 and PROXY not in bans[0].split(" via ")[0]


def test_failed_authentications_through_the_proxy_never_lock_out_its_address(settings,
                                                                           failed_auth_rule):
    AccessListEntry.objects.all().delete()
    limiter().policies.reset()
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "TRUSTED_PROXIES": ["10.0.0.0/8"]}
    proxy = Client(REMOTE_ADDR=PROXY)
    for i in range(BURST * 3):
        assert proxy.get("/api/items/", HTTP_X_API_KEY=f"rk_guess_{i}").status_code == 200
    assert proxy.get("/api/items/", HTTP_X_API_KEY="rk_guess_x").status_code == 200
    # a client behind it is locked out by its own failures, as any client is
    client = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="198.51.100.5")
    for i in range(BURST):
        client.get("/api/items/", HTTP_X_API_KEY=f"rk_guess_{i}")
    assert client.get("/api/items/", HTTP_X_API_KEY="rk_guess_x").status_code == 429
