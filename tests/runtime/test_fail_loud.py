"""Fail loud, never silently open: a decision path that raises something other than "Redis is
unavailable" is reported by ``manage.py check`` (E008) and ``manage.py ratelimit check`` (exit 1,
with the reason), counted apart from Redis errors (dashboard, Prometheus) and logged at a
bounded rate, while every request still gets its response.

The fault is real, not mocked: a redis-py ConnectionPool subclass with redis-py 5.0's
``get_connection(command_name, ...)`` signature, on the suite's real redis-server. Two ways:

- ``decisions_as_on_redis_5_0``: exactly what redis-py 5.0–5.2 did to this app. redis-py's own
  calls (PING, GET, SCRIPT LOAD) work, the decision path's own ``get_connection()`` call raises
  TypeError. Only a real decision finds it.
- ``pool_class_for_redis_5_0``: the same pool named in the cache's CONNECTION_POOL_CLASS (a pool
  written for an older redis-py): every call through that client raises TypeError, PING too.
"""

import html
import io
import logging

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.test import Client
from redis.connection import ConnectionPool

from ratelimit_app.admin.dashboard.data import dashboard_data
from ratelimit_app.models import Plan, Rule, Scope
from ratelimit_app.process.unexpected import MAX_TYPES, OTHER, UnexpectedErrorLog
from ratelimit_app.runtime.limiter import Limiter, LimiterStats, install_limiter
from ratelimit_app.stores.connections import HeldConnections

from ..conftest import caches_for
from ..helpers import FakeClock, limiter

pytestmark = pytest.mark.django_db

MISSING_COMMAND_NAME = "get_connection() missing 1 required positional argument: 'command_name'"
TOKEN = "scrape-token"


class Redis50Pool(ConnectionPool):
    """A real redis-py pool whose ``get_connection`` has redis-py 5.0–5.2's signature: the
    command name is required (5.3 made it optional; the decision path passes none)."""

    def get_connection(self, command_name, *keys, **options):
        return super().get_connection()


@pytest.fixture
def quota():
    """A plan for anonymous clients with one IP rule: every request is one take.lua call."""
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="free-ip", plan=plan, scope=Scope.IP, rate=1, period_s=60,
                        burst=100)


@pytest.fixture
def clock():
    return FakeClock(1_700_000_000_000)


@pytest.fixture
def decisions_as_on_redis_5_0(settings, redis_server, clock):
    """Install a Limiter on the suite's Redis whose decisions take their connections from a
    Redis50Pool, as under redis-py 5.0 (its own client passed a command name; the app's
    decision path does not). Returns the Limiter."""
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "PROMETHEUS_ENABLED": True,
                              "PROMETHEUS_TOKEN": TOKEN, "CONFIG_CHECK_INTERVAL_S": 3600}
    broken = Limiter.from_settings(clock, metrics_autostart=False)
    pool = Redis50Pool.from_url(redis_server.url, socket_timeout=0.25)
    broken.store._connections = HeldConnections(pool)
    install_limiter(broken, clock=clock, metrics_autostart=False)
    yield broken
    pool.disconnect()


@pytest.fixture
def pool_class_for_redis_5_0(settings, redis_server, clock):
    """Point the cache at a Redis50Pool through django-redis's CONNECTION_POOL_CLASS."""
    caches = caches_for(redis_server.url + "?client_name=redis50pool")  # its own pool
    caches["default"]["OPTIONS"]["CONNECTION_POOL_CLASS"] = \
        "tests.runtime.test_fail_loud.Redis50Pool"
    settings.CACHES = caches
    install_limiter(clock=clock, metrics_autostart=False)


def ratelimit_check():
    """Run ``manage.py ratelimit check``; return ``(exit code, output lines)``."""
    out = io.StringIO()
    try:
        call_command("ratelimit", "check", stdout=out)
        code = 0
    except CommandError as failure:
        code = failure.returncode
        out.write(str(failure))
    return code, out.getvalue().splitlines()


def app_messages():
    return {m.id: m for m in run_checks() if m.id.startswith("ratelimit_app.")}


def prometheus_text():
    response = Client().get("/ratelimit/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return response.content.decode()


def unexpected_records(caplog):
    return [r for r in caplog.records
            if r.name == "ratelimit_app" and "unexpected TypeError" in r.getMessage()]


# --- manage.py check and manage.py ratelimit check ---------------------------------------------

def test_system_check_finds_a_decision_path_that_only_a_real_decision_meets(
        decisions_as_on_redis_5_0):
    found = app_messages()
    assert set(found) == {"ratelimit_app.E008"}  # PING and the script call work: no W004/E006
    message = found["ratelimit_app.E008"]
    assert message.msg.startswith("A decision on a scratch identity failed with an unexpected "
                                  "error: TypeError: ")
    assert MISSING_COMMAND_NAME in message.msg
    assert "(raised at ratelimit_app/stores/connections.py:" in message.msg
    assert "not Redis being down" in message.hint
    with pytest.raises(SystemCheckError, match="ratelimit_app.E008"):
        call_command("check", stdout=io.StringIO(), stderr=io.StringIO())


def test_ratelimit_check_exits_1_and_says_the_decision_fails_unexpectedly(
        decisions_as_on_redis_5_0):
    code, lines = ratelimit_check()
    assert code == 1 and lines[-1] == "2 checks failed."
    assert lines[0].startswith("FAIL  system check ratelimit_app.E008: ")
    assert "OK    store: the redis store answers PING" in lines
    assert "OK    script: the limiter's script runs" in lines
    [decision] = [line for line in lines if line.startswith("FAIL  decision: ")]
    assert decision.startswith("FAIL  decision: unexpected error (a bug or a library "
                               "incompatibility; every request is let through unlimited): "
                               "TypeError: ")
    assert MISSING_COMMAND_NAME in decision


def test_a_client_that_fails_everywhere_is_an_unexpected_error_not_redis_down(
        pool_class_for_redis_5_0):
    found = app_messages()
    assert "ratelimit_app.E008" in found and "ratelimit_app.W004" not in found
    assert found["ratelimit_app.E008"].msg.startswith(
        "The rate-limit store's client failed with an unexpected error: TypeError: ")
    assert MISSING_COMMAND_NAME in found["ratelimit_app.E008"].msg
    code, lines = ratelimit_check()
    assert code == 1
    [store] = [line for line in lines if line.startswith("FAIL  store: ")]
    assert store.startswith("FAIL  store: unexpected error (a bug or a library "
                            "incompatibility): TypeError: ")
    assert "FAIL  decision: not checked: the store's client fails" in lines


def test_redis_down_is_reported_as_unavailable_not_unexpected(redis_server):
    redis_server.kill()
    code, lines = ratelimit_check()
    assert code == 1
    assert not [line for line in lines if "unexpected" in line]
    assert "FAIL  decision: not checked: the store does not answer" in lines
    assert "ratelimit_app.E008" not in app_messages()


def test_checks_leave_nothing_behind_in_redis(quota, redis_client):
    assert Client().get("/hello/").status_code == 200  # a real bucket, to be left alone
    keys_before = sorted(redis_client.scan_iter(count=1000))
    stats_before = redis_client.info("commandstats")
    call_command("check", stdout=io.StringIO())
    code, lines = ratelimit_check()
    assert code == 0 and any(line.startswith("OK    decision: a scratch decision was allowed "
                                             "and its key deleted (") for line in lines)
    assert sorted(redis_client.scan_iter(count=1000)) == keys_before
    assert redis_client.dbsize() == len(keys_before)
    stats_after = redis_client.info("commandstats")
    # the round trips really ran: the check, then the command's system checks and its own
    # (scratch takes through EVALSHA, each followed by the DEL of its key)
    assert calls(stats_after, "del") - calls(stats_before, "del") == 3
    assert calls(stats_after, "evalsha") - calls(stats_before, "evalsha") >= 3


def calls(commandstats, command):
    return commandstats.get(f"cmdstat_{command}", {}).get("calls", 0)


# --- the request path: answered, counted, logged at a bounded rate -------------------------------

def test_requests_are_answered_and_unexpected_errors_counted_apart_from_redis_errors(
        quota, decisions_as_on_redis_5_0, clock, caplog):
    client = Client()
    for _ in range(5):
        response = client.get("/hello/")
        assert response.status_code == 200 and "RateLimit" not in response
        assert response.wsgi_request.ratelimit.degraded == "error"
    stats = decisions_as_on_redis_5_0.stats
    assert stats.unexpected_errors == 5 and stats.unexpected_by_type == {"TypeError": 5}
    assert stats.redis_errors == 0
    assert stats.last_unexpected_type == "TypeError"
    assert MISSING_COMMAND_NAME in stats.last_unexpected_message

    # one traceback for five errors of one type within a minute
    [first] = unexpected_records(caplog)
    assert first.levelno == logging.ERROR and first.exc_info[0] is TypeError
    assert first.getMessage().startswith("ratelimit_app: unexpected TypeError while deciding a "
                                         "request; request allowed: ")
    clock.advance(61_000)
    assert client.get("/hello/").status_code == 200
    [_, second] = unexpected_records(caplog)
    assert second.exc_info[0] is TypeError
    assert "(4 more TypeError since the last report 61 s ago were not logged)" in \
        second.getMessage()

    text = prometheus_text()
    assert 'ratelimit_process_unexpected_errors_total{type="TypeError"} 6.0' in text
    assert "ratelimit_process_redis_errors 0.0" in text

    health = dashboard_data()["health"]
    assert health["unexpected"]["count"] == 6 and health["redis_ok"]
    panel = dashboard_data()["html"]["health"]
    assert 'data-unexpected-count="6"' in panel and "TypeError" in panel
    assert MISSING_COMMAND_NAME in html.unescape(panel)


def test_redis_down_counts_as_a_redis_error_only(quota, redis_server):
    client = Client()
    assert client.get("/hello/").status_code == 200  # the snapshot, loaded while Redis is up
    redis_server.kill()
    assert client.get("/hello/").status_code == 200
    stats = limiter().stats
    assert stats.redis_errors >= 1 and stats.unexpected_errors == 0


def test_dashboard_and_prometheus_answer_while_the_client_fails_everywhere(
        quota, pool_class_for_redis_5_0, settings):
    assert Client().get("/hello/").status_code == 200
    assert limiter().stats.unexpected_errors == 1
    data = dashboard_data()
    assert data["health"]["redis_ok"] is False and data["health"]["redis_error_unexpected"]
    assert "cannot be read</span>: unexpected TypeError" in data["html"]["health"]
    assert 'data-unexpected-count="1"' in data["html"]["health"]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "PROMETHEUS_ENABLED": True,
                              "PROMETHEUS_TOKEN": TOKEN}
    # (the settings change built a new Limiter: this process's count starts again)
    assert Client().get("/hello/").status_code == 200
    text = prometheus_text()
    assert "ratelimit_metrics_redis_up 0.0" in text
    assert 'ratelimit_process_unexpected_errors_total{type="TypeError"} 1.0' in text


# --- bounded memory ------------------------------------------------------------------------------

def error_types(count):
    return [type(f"Error{i}", (Exception,), {}) for i in range(count)]


def test_the_log_tracks_a_bounded_number_of_types(caplog):
    seconds = [0.0]
    log = UnexpectedErrorLog(clock=lambda: seconds[0], interval_s=60, max_types=3)
    for kind in error_types(10) * 2:
        log.report(kind("boom"), "testing")
    logged = [r for r in caplog.records if r.name == "ratelimit_app"]
    # three types in full, the other seven share one entry: one line for them all
    assert [r.exc_info[0].__name__ for r in logged] == ["Error0", "Error1", "Error2", "Error3"]
    assert len(log._types) == 4 and OTHER in log._types
    seconds[0] = 60.0
    log.report(error_types(10)[9]("again"), "testing")
    assert "(13 more other since the last report 60 s ago were not logged)" in \
        caplog.records[-1].getMessage()


def test_the_counters_keep_a_bounded_number_of_types():
    stats = LimiterStats()
    for kind in error_types(MAX_TYPES + 5):
        stats.count_unexpected(kind("boom"))
    assert len(stats.unexpected_by_type) == MAX_TYPES + 1
    assert stats.unexpected_by_type[OTHER] == 5 and stats.unexpected_errors == MAX_TYPES + 5
    assert stats.last_unexpected_type == f"Error{MAX_TYPES + 4}"
