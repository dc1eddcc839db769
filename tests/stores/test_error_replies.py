"""Error replies are known by their code, the word a reply starts with, never by the words after
it, which servers change (Valkey answers an unknown script with "NOSCRIPT No matching script.",
Redis 7 adds "Please use EVAL."). Against real servers of the kind the suite runs (Redis, or
Valkey in the valkey cell): what a decision makes of NOSCRIPT, BUSY, NOREPLICAS and a reply
whose code merely starts like a transient one (BUSYKEY)."""

import logging
import threading

import pytest
import redis
from redis.exceptions import NoScriptError, ResponseError

from ratelimit_app.runtime.limiter import Limiter
from ratelimit_app.stores.base import StoreUnavailable, is_misconfiguration, reply_code
from ratelimit_app.stores.redis import RedisStore
from ratelimit_app.testing import RedisServer

from ..helpers import limiter, make_bucket, make_rule, poll_until

pytestmark = pytest.mark.django_db

SPIN_FOREVER = "while true do end"  # a script that runs until SCRIPT KILL


@pytest.fixture
def private_server(server_executable):
    """A server of the test's own (it is made busy or refuses writes), stopped after it."""
    server = RedisServer(executable=server_executable,
                         extra_args=["--busy-reply-threshold", "10"]).start()
    yield server
    server.stop()


def limiter_on(server):
    return Limiter(limiter().config, RedisStore(server.client()), metrics_autostart=False)


def refused_take(server, caplog):
    """Take one bucket on ``server`` through a Limiter; return the StoreUnavailable it raised
    and the records it logged."""
    bucket = make_bucket(make_rule())
    with caplog.at_level(logging.WARNING, logger="ratelimit_app"), \
            pytest.raises(StoreUnavailable) as raised:
        limiter_on(server).take((bucket,))
    return raised.value, [r for r in caplog.records if r.name.startswith("ratelimit_app")]


def busy_reply(client):
    """The server's reply to PING: None when it answers PONG, else the error it answered."""
    try:
        client.ping()
    except ResponseError as error:
        return error
    return None


def test_an_unknown_script_is_noscript_by_its_code_and_a_decision_loads_it(redis_server):
    client = redis_server.client()
    with pytest.raises(NoScriptError) as raised:
        client.evalsha("0" * 40, 0)
    assert not is_misconfiguration(raised.value)

    client.script_flush()
    noscript_before = client.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0)
    bucket = make_bucket(make_rule(burst=3))
    reply = limiter().take((bucket,))
    assert reply.allowed and list(reply.results) == [1]
    # the server did say NOSCRIPT; the store loaded the script and sent the call again
    assert client.info("errorstats")["errorstat_NOSCRIPT"]["count"] == noscript_before + 1
    assert limiter().stats.redis_errors == 0


def test_a_server_busy_running_a_script_is_unavailable_not_misconfigured(private_server, caplog):
    spinner = private_server.client(socket_timeout=30)
    spinning = threading.Thread(target=lambda: _run_until_killed(spinner), daemon=True)
    spinning.start()
    try:
        watcher = private_server.client()
        poll_until(lambda: busy_reply(watcher) is not None, what="the server to answer BUSY")
        assert reply_code(busy_reply(watcher)) == "BUSY"

        error, records = refused_take(private_server, caplog)
    finally:
        private_server.client().script_kill()
        spinning.join(10)
    assert reply_code(error.__cause__) == "BUSY" and not is_misconfiguration(error)
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "Redis unavailable" in records[0].getMessage()


def _run_until_killed(client):
    try:
        client.eval(SPIN_FOREVER, 0)
    except redis.RedisError:
        pass  # SCRIPT KILL ends it with an error reply


def test_a_master_short_of_replicas_in_sync_is_unavailable_not_misconfigured(private_server,
                                                                             caplog):
    client = private_server.client()
    client.config_set("min-replicas-to-write", 1)  # and it has none
    error, records = refused_take(private_server, caplog)
    assert reply_code(error.__cause__) == "NOREPLICAS" and not is_misconfiguration(error)
    assert [r.levelno for r in records] == [logging.WARNING]


def test_a_code_that_only_starts_like_a_transient_one_is_not_transient(redis_server):
    """BUSYKEY (RESTORE onto a key that exists) starts with BUSY; waiting does not cure it."""
    client = redis_server.client()
    client.set("rl:restored", b"1")
    with pytest.raises(ResponseError) as raised:
        client.restore("rl:restored", 0, client.dump("rl:restored"))
    assert reply_code(raised.value) == "BUSYKEY"
    assert is_misconfiguration(raised.value)


def test_a_refusal_no_wait_cures_is_logged_as_misconfigured(private_server, caplog):
    """An ACL without EVALSHA: the reply's code (NOPERM), not its words, makes it an error."""
    client = private_server.client()
    client.acl_setuser("default", enabled=True, nopass=True, commands=["+@all", "-evalsha"],
                       keys=["*"], channels=["*"])
    error, records = refused_take(private_server, caplog)
    assert is_misconfiguration(error)
    assert [r.levelno for r in records] == [logging.ERROR]
    assert "misconfigured" in records[0].getMessage()
