"""Redis key names: hashed scope values, one hash tag per scope value, bounded and valid whatever
a client sends (checked on the keys really written to Redis)."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from ratelimit_app.decision.buckets import unpack_value
from ratelimit_app.decision.keys import bucket_key, config_version_key, metrics_key, scope_token
from ratelimit_app.models import Plan, PlanAssignment, Rule, Scope

from ..helpers import limiter, load_demo_data

DIGEST_RE = r"[0-9A-Za-z_-]{22}"  # 16 bytes of BLAKE2b, URL-safe base64
TOKEN_RE = rf"(?:global|(?:ip|user|key|tenant|plan)\.{DIGEST_RE})"
BUCKET_KEY_RE = re.compile(rf"^rl:\{{(?P<token>{TOKEN_RE})\}}$")
MAX_BUCKET_KEY_LENGTH = 40
# a credential's proof from an address (protection/failed_auth.py): two tokens, both digests
PROOF_KEY_RE = re.compile(rf"^rl:\{{(?P<token>{TOKEN_RE})\}}:p\.(?P<credential>{TOKEN_RE})$")
MAX_PROOF_KEY_LENGTH = 70

HOSTILE = [
    "{evil}", "}{", "a:b:c", "{a}:1:{b}", "rl:{global}:1:global",
    "x" * 10_000, "ключ-🔑-鍵", "\udcff", "\ud800", "nul\x00byte", "crlf\r\nSet-Cookie: a=b",
    "", " ", "*", "\\", "fe80::1%{evil}:x", "::ffff:1.2.3.4",
]


# --- unit ---------------------------------------------------------------------------------------

def test_scope_token_is_a_fixed_length_hash_of_the_value():
    token = scope_token("ip", "203.0.113.5")
    assert re.fullmatch(rf"ip\.{DIGEST_RE}", token)
    assert token == scope_token("ip", "203.0.113.5")
    assert token != scope_token("ip", "203.0.113.6")
    assert token != scope_token("user", "203.0.113.5")  # the kind is part of the token
    assert scope_token("user", 42) == scope_token("user", "42")
    assert scope_token("tenant", b"acme") == scope_token("tenant", "acme")


@pytest.mark.parametrize("value", HOSTILE)
def test_scope_token_of_hostile_values_is_key_safe(value):
    token = scope_token("tenant", value)
    if value == "":
        assert token == "tenant"
    else:
        assert re.fullmatch(rf"tenant\.{DIGEST_RE}", token)


def test_bucket_key_is_the_tagged_scope_value():
    token = scope_token("user", "7")
    key = bucket_key("rl", token)
    assert key == f"rl:{{{token}}}"
    assert BUCKET_KEY_RE.match(key)


def test_config_and_metrics_keys_share_no_tag_with_buckets():
    assert config_version_key("rl") == "rl:config:version"
    assert metrics_key("rl", "denied", 1700000000) == "rl:m:denied:1700000000"
    assert "{" not in metrics_key("rl", "x")


# --- hostile requests, then every key in Redis --------------------------------------------------

def tenant_from_header(request):
    return request.META.get("HTTP_X_TENANT")


def all_keys(redis_client):
    return [k.decode("utf-8", "replace") for k in redis_client.scan_iter(count=1000)]


def assert_keys_are_valid(keys):
    """Every bucket key matches the schema and is short; other keys are the app's own."""
    bucket_keys = []
    for key in keys:
        if key == config_version_key("rl") or key.startswith("rl:m:"):
            # (the usage keys' one fixed tag, {usage}, holds no request input)
            assert len(key) <= 200 and "{" not in key.replace("rl:m:{usage}:", ""), key
            continue
        proof = PROOF_KEY_RE.match(key)
        if proof:
            assert len(key) <= MAX_PROOF_KEY_LENGTH
            continue
        match = BUCKET_KEY_RE.match(key)
        assert match, f"bad key {key!r}"
        assert len(key) <= MAX_BUCKET_KEY_LENGTH
        bucket_keys.append(match)
    return bucket_keys


@pytest.fixture
def hostile_setup(settings, db):
    load_demo_data()
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "TRUSTED_PROXIES": ["127.0.0.1"],
                              "TENANT_RESOLVER": "tests.decision.test_keys.tenant_from_header"}
    Rule.objects.create(name="any-tenant", scope=Scope.TENANT, rate=1000, period_s=60,
                        burst=1000)


def test_hostile_identities_give_bounded_valid_keys_and_no_500(hostile_setup, redis_client):
    statuses = []
    User = get_user_model()
    free = Plan.objects.get(slug="free")
    for i, value in enumerate(HOSTILE):
        anonymous = Client()
        signed_in = Client()
        # the headers carry the raw value; the user and tenant rows hold what a database can
        # store: no lone surrogate (SQLite, PostgreSQL), no NUL and no more than the column's
        # length (PostgreSQL). Numbered so "" is unique.
        stored = value.encode("utf-8", "replace").decode().replace("\x00", "")
        user = User.objects.create(username=f"{i}{stored}"[:150])
        PlanAssignment.objects.create(user=user, plan=free, tenant=stored[:100])
        signed_in.force_login(user)
        for client in (anonymous, signed_in):
            for path in ("/hello/", "/api/items/"):
                response = client.get(path, HTTP_X_API_KEY=value, HTTP_X_FORWARDED_FOR=value,
                                      HTTP_X_TENANT=value)
                statuses.append(response.status_code)
                # really limited: not waved through because the limiter failed on the input
                assert response.wsgi_request.ratelimit.degraded == ""
                assert "RateLimit" in response
    assert set(statuses) <= {200, 429}

    limiter().flusher.flush_now()  # the metrics keys too
    bucket_keys = assert_keys_are_valid(all_keys(redis_client))
    kinds = {m["token"].split(".")[0] for m in bucket_keys}
    # (the global bucket refills in milliseconds, so its key may already have expired)
    assert kinds - {"global"} == {"plan", "tenant", "user", "ip"}


def test_one_identitys_buckets_share_one_key_across_rules(settings, db, redis_client):
    load_demo_data()
    client = Client()
    client.post("/api/reports/", HTTP_X_API_KEY="rk_alice_free")
    bucket_keys = assert_keys_are_valid(all_keys(redis_client))
    key_buckets = [m for m in bucket_keys if m["token"].startswith("key.")]
    # free-user and free-reports: two rules, one key (one tag), one record each
    assert len(key_buckets) == 1
    _, records = unpack_value(redis_client.get(key_buckets[0].string))
    rules = {r.id: r.name for r in Rule.objects.filter(id__in=records)}
    assert sorted(rules.values()) == ["free-reports", "free-user"]
