"""Ban checks folded into a token bucket's argument (stores/ban_checks.py), against the suite's
real redis-server: the store's folded call answers exactly what the call the engine built
answers when sent as built, and leaves the same values behind, whatever the keys hold."""

import pytest

from ratelimit_app.decision.buckets import BanGate, CheckedBucket, pack_value
from ratelimit_app.decision.engine import statuses_from, take_args
from ratelimit_app.decision.keys import bucket_key
from ratelimit_app.protection.bans import BanGateRule, gate_record_id
from ratelimit_app.stores.ban_checks import BAN_CHECK_FULL, fold_ban_checks
from ratelimit_app.stores.base import script_source
from ratelimit_app.stores.redis import RedisStore, parse_take_reply

from ..helpers import make_bucket, make_rule

NOW = 1_700_000_000_000
MINUTE = 60_000  # units per token of a 1-minute rule
GATE = BAN_CHECK_FULL  # a ban gate's capacity (units): take.lua's GATE
VERSION_KEY = "test:version"

USER_KEY, IP_KEY = bucket_key("rl", "user.7"), bucket_key("rl", "ip.203.0.113.9")
PLAN = make_bucket(make_rule(rate=1, period_s=60, burst=50, scope="plan", shadow=True),
                   token="plan.pro")
USER = make_bucket(make_rule(rate=1, period_s=60, burst=5, scope="user"), token="user.7")
# a second bucket in the user's key (an endpoint's rule): the user's key is then sent twice
USER_ENDPOINT = make_bucket(make_rule(rate=1, period_s=60, burst=2, scope="user",
                                      endpoint="search"), token="user.7")
DAILY = make_bucket(make_rule(rate=100, scope="user", calendar="day"), token="user.7")
USER_BAN = BanGate(BanGateRule(id=gate_record_id(1), name="guessers", scope="user"), USER_KEY)
IP_BAN = BanGate(BanGateRule(id=gate_record_id(2), name="scrapers", scope="ip"), IP_KEY)
OTHER_IP_RECORD = 99  # another rule's record in the address's key (a failed-auth gate's)


def banned_for(ms):
    """A gate record whose ban has ``ms`` to run at NOW: (level, stamp, period)."""
    return (GATE - ms, NOW, 1000)


def value(records):
    return pack_value(records, NOW + 10 * MINUTE)


SCENARIOS = {
    # name: (buckets, the keys' values before the call, debit, allowed)
    "no ban": ([PLAN, USER, USER_BAN, IP_BAN], {}, True, True),
    "a shadow bucket short, no ban": (  # allowed, yet the full reply
        [PLAN, USER, USER_BAN, IP_BAN], {PLAN.key: value({PLAN.rule.id: (0, NOW, MINUTE)})},
        True, True),
    "the user banned": (
        [PLAN, USER, USER_BAN, IP_BAN],
        {USER_KEY: value({USER.rule.id: (3 * MINUTE, NOW, MINUTE),
                          USER_BAN.rule.id: banned_for(5000)})},
        True, False),
    "the user's key holding its ban alone": (
        [PLAN, USER, USER_BAN, IP_BAN], {USER_KEY: value({USER_BAN.rule.id: banned_for(5000)})},
        True, False),
    "the address banned, its record second": (
        [PLAN, USER, USER_BAN, IP_BAN],
        {IP_KEY: value({OTHER_IP_RECORD: (0, NOW, 1000), IP_BAN.rule.id: banned_for(900)})},
        True, False),
    "a ban that is over": (
        [PLAN, USER, USER_BAN, IP_BAN],
        {USER_KEY: value({USER.rule.id: (3 * MINUTE, NOW, MINUTE),
                          USER_BAN.rule.id: (GATE - 600_000, NOW - 700_000, 1000)})},
        True, True),
    "both banned, only looked at": (
        [PLAN, USER, USER_BAN, IP_BAN],
        {USER_KEY: value({USER_BAN.rule.id: banned_for(5000)}), IP_KEY: value({IP_BAN.rule.id:
                                                                         banned_for(900)})},
        False, False),
    "the bucket short as well": (
        [PLAN, USER, USER_BAN, IP_BAN],
        {USER_KEY: value({USER.rule.id: (0, NOW, MINUTE), USER_BAN.rule.id: banned_for(5000)})},
        True, False),
    "the user's key sent twice": (
        [USER_ENDPOINT, USER, USER_BAN, IP_BAN],
        {USER_KEY: value({USER.rule.id: (3 * MINUTE, NOW, MINUTE),
                          USER_BAN.rule.id: banned_for(5000)})},
        True, False),
    "a checked bucket as the host": (
        [CheckedBucket(USER.rule, USER_KEY), IP_BAN],
        {IP_KEY: value({IP_BAN.rule.id: banned_for(900)})}, True, False),
    "no token bucket to carry the checks": (
        [DAILY, USER_BAN], {USER_KEY: value({USER_BAN.rule.id: banned_for(5000)})}, True, False),
}


@pytest.fixture
def store(redis_client):
    redis_client.script_load(script_source("take"))
    return RedisStore(redis_client)


def call(redis_client, store, buckets, states, debit, *, folded):
    """Set ``states``, send the decision's call (folded by the store, or as the engine built
    it); return its TakeReply and every key's value after it."""
    redis_client.flushdb()
    for key, stored in states.items():
        redis_client.set(key, stored, px=10 * MINUTE)
    keys = tuple(bucket.key for bucket in buckets)
    args = tuple(take_args(buckets, now_ms=NOW, debit=debit))
    if folded:
        reply = store.take(keys, args, version_key=VERSION_KEY)
    else:
        reply = parse_take_reply(redis_client.evalsha(store.take_sha, len(keys) + 1, *keys,
                                                      VERSION_KEY, *args))
    return reply, {key: redis_client.get(key) for key in redis_client.scan_iter("*")}


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_folded_call_answers_and_writes_what_the_call_as_built_does(redis_client, store,
                                                                        name):
    buckets, states, debit, allowed = SCENARIOS[name]
    as_built, written = call(redis_client, store, buckets, states, debit, folded=False)
    reply, folded_written = call(redis_client, store, buckets, states, debit, folded=True)

    assert reply == as_built
    assert folded_written == written
    assert reply.allowed is allowed
    statuses = statuses_from(buckets, reply)
    for bucket, status in zip(buckets, statuses):
        if type(bucket) is BanGate:  # short exactly while a ban is in force
            record = states.get(bucket.key, b"")
            assert status.short is (bucket.rule.id.to_bytes(4, "little", signed=True) in record
                                    and name != "a ban that is over")


def test_a_folded_check_has_no_entry_of_its_own():
    """The user's ban rides in the user's bucket (the user's key is sent once); the address's
    key, read for nothing else, comes after the version key; a calendar quota carries none."""
    buckets = [PLAN, USER, USER_BAN, IP_BAN]
    args = tuple(take_args(buckets))
    fold = fold_ban_checks([b.key for b in buckets], args)

    assert fold.keys == (PLAN.key, USER_KEY)
    assert fold.extra_keys == (IP_KEY,)
    assert fold.args[:3] == args[:3]  # the head and the plan's bucket, as built
    assert fold.args[3] == USER.spec + USER_BAN.spec + (2).to_bytes(4, "little") \
        + IP_BAN.spec + (4).to_bytes(4, "little")  # KEYS: plan, user, version, address
    assert len(fold.args) == len(args) - 2
    assert fold_ban_checks([b.key for b in (DAILY, USER_BAN)],
                           tuple(take_args([DAILY, USER_BAN]))) is None
    assert fold_ban_checks([PLAN.key, USER_KEY], tuple(take_args([PLAN, USER]))) is None
