"""What one request costs the backing stores once warm: exactly one Redis command (an EVALSHA,
whatever the depth of the hierarchy) and no database query, counted on the real servers.

Redis is observed on the server: EVALSHA calls from ``INFO commandstats`` deltas, and the list of
top-level commands clients sent from ``MONITOR``. (commandstats alone cannot give "commands per
request": it also counts the MGET, TIME and SETs the Lua script runs inside its one EVALSHA.)
The database is observed with Django's query capture.
"""

import io
from dataclasses import dataclass
from itertools import count

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ..helpers import use_fake_clock

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins
    call_command("load_demo", stdout=io.StringIO())


@dataclass
class Measurement:
    response: object
    evalsha: int      # EVALSHA calls the server counted during the request
    commands: list    # top-level commands clients sent, e.g. ["EVALSHA"]
    queries: int      # database queries


class ServerView:
    """Watches the suite's redis-server while one request runs."""

    def __init__(self, redis_server):
        self._markers = count()
        self._control = redis_server.client()
        self._control_addr = self._control.client_info()["addr"]
        self._monitor = redis_server.client().monitor()
        self._monitor.__enter__()

    def close(self):
        self._monitor.__exit__(None, None, None)
        self._control.close()

    def _evalsha_calls(self):
        stats = self._control.info("commandstats")
        return stats.get("cmdstat_evalsha", {}).get("calls", 0)

    def _commands_until(self, marker):
        commands = []
        while True:
            seen = self._monitor.next_command()
            if f"{seen['client_address']}:{seen['client_port']}" == self._control_addr:
                if marker in seen["command"]:
                    return commands
                continue  # our own INFO calls
            if seen["client_type"] != "lua":  # commands a script runs are not round trips
                commands.append(seen["command"].split(" ", 1)[0].upper())

    def measure(self, send):
        """Run ``send()`` and return a Measurement of what it cost."""
        self._sync()
        evalsha_before = self._evalsha_calls()
        with CaptureQueriesContext(connection) as queries:
            response = send()
        evalsha_after = self._evalsha_calls()
        return Measurement(response, evalsha_after - evalsha_before, self._sync(), len(queries))

    def _sync(self):
        """Return the commands clients sent since the previous call."""
        marker = f"ratelimit-test-marker-{next(self._markers)}"
        self._control.echo(marker)
        return self._commands_until(marker)


@pytest.fixture
def server(redis_server):
    view = ServerView(redis_server)
    yield view
    view.close()


def levels(response):
    """The number of buckets (enforced and shadow) the request was charged against."""
    return len(response.wsgi_request.ratelimit.policies)


KEYS = {"alice": "rk_alice_free", "carol": "rk_carol_enterprise"}

CASES = [
    # id, path, API key, expected levels (from the demo rules)
    ("anonymous-drf-search", "/api/search/?q=1", None, 4),      # global plan ip search-trial
    ("alice-key-drf-search", "/api/search/?q=1", "alice", 5),    # + free-user
    ("carol-key-drf-items", "/api/items/", "carol", 3),          # global user tenant
    ("anonymous-plain-view", "/hello/", None, 3),                # global plan ip
]


@pytest.mark.parametrize("path, key, expected_levels", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_one_redis_command_and_no_query_per_request_once_warm(demo, server, path, key,
                                                             expected_levels):
    client = Client(HTTP_X_API_KEY=KEYS[key]) if key else Client()
    client.get(path)  # warm: compiles the snapshot, loads the script if needed
    for _ in range(3):
        seen = server.measure(lambda: client.get(path))
        assert seen.response.status_code == 200
        assert levels(seen.response) == expected_levels
        assert (seen.evalsha, seen.commands, seen.queries) == (1, ["EVALSHA"], 0)


def test_session_user_on_a_plain_view_adds_one_command_and_no_query(demo, server, settings):
    """Session auth queries the DB by itself: compare with the limiter switched off."""
    client = Client()
    assert client.login(username="alice", password="demo-pass")
    client.get("/hello/")  # warm
    limited = server.measure(lambda: client.get("/hello/"))
    assert limited.response.status_code == 200
    assert levels(limited.response) == 4  # global plan ip user
    assert limited.response.wsgi_request.ratelimit.identity.kind == "user"
    assert (limited.evalsha, limited.commands) == (1, ["EVALSHA"])

    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "QuotaMiddleware" not in m]
    unlimited_client = Client()
    unlimited_client.cookies = client.cookies
    unlimited = server.measure(lambda: unlimited_client.get("/hello/"))
    assert unlimited.response.status_code == 200
    assert not hasattr(unlimited.response.wsgi_request, "ratelimit")
    assert (unlimited.evalsha, unlimited.commands) == (0, [])
    assert limited.queries == unlimited.queries > 0  # session + user rows; the limiter adds none


def test_session_user_on_a_drf_view_is_one_command(demo, server):
    client = Client()
    assert client.login(username="bob", password="demo-pass")
    client.get("/api/search/")
    seen = server.measure(lambda: client.get("/api/search/"))
    assert seen.response.status_code == 200
    assert levels(seen.response) == 3  # global pro-user search-trial
    assert (seen.evalsha, seen.commands) == (1, ["EVALSHA"])


def test_a_denied_request_is_still_one_command(demo, server, settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "LOCAL_DENY_CACHE": False}
    client = Client(HTTP_X_API_KEY=KEYS["alice"])
    client.get("/api/items/")  # warm
    statuses = []
    for _ in range(7):  # free-user: burst 30, one item + five searches of 5 each fit
        seen = server.measure(lambda: client.get("/api/search/"))
        statuses.append(seen.response.status_code)
        assert (seen.evalsha, seen.commands, seen.queries) == (1, ["EVALSHA"], 0)
    assert statuses == [200] * 5 + [429] * 2


def test_request_seen_by_middleware_and_throttle_is_charged_once(demo, server, settings,
                                                                 monkeypatch):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "MIDDLEWARE_INCLUDES_DRF": True}
    use_fake_clock(monkeypatch)  # no refill between the two requests: exact differences
    client = Client(HTTP_X_API_KEY=KEYS["alice"])
    first = client.get("/api/search/")
    second = server.measure(lambda: client.get("/api/search/"))
    assert second.response.status_code == 200
    assert (second.evalsha, second.commands) == (1, ["EVALSHA"])

    def statuses(response):
        return {p.name: p for p in response.wsgi_request.ratelimit.policies}

    before, after = statuses(first), statuses(second.response)
    units_dropped = {name: before[name].level_units - after[name].level_units for name in before}
    units_per_token = {name: status.window_s * 1000 for name, status in before.items()}
    # search costs 5 on every level but the endpoint rule, which counts calls
    assert {name: units / units_per_token[name] for name, units in units_dropped.items()} == {
        "global": 5, "free-plan": 5, "free-ip": 5, "free-user": 5, "search-ip-trial": 1}


def test_throttle_alone_charges_the_same_once(demo, server, monkeypatch):
    use_fake_clock(monkeypatch)
    client = Client(HTTP_X_API_KEY=KEYS["alice"])
    first = client.get("/api/search/")
    second = server.measure(lambda: client.get("/api/search/"))
    assert (second.evalsha, second.commands) == (1, ["EVALSHA"])
    before = {p.name: p.remaining for p in first.wsgi_request.ratelimit.policies}
    after = {p.name: p.remaining for p in second.response.wsgi_request.ratelimit.policies}
    assert before["free-user"] - after["free-user"] == 5
