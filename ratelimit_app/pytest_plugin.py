"""A pytest plugin: a project's own test suite runs with QuotaThrottle and QuotaMiddleware on.

Opt in with one line in the project's ``conftest.py`` (it needs pytest-django)::

    pytest_plugins = ["ratelimit_app.pytest_plugin"]

Then, for the whole test session:

- one server holds the buckets: a private embedded server (the ``[embedded]`` extra), or the
  Redis that ``REDIS_URL`` names when it is set (it must be empty: every test empties it);
- every test starts from full buckets (the server is emptied) and a fresh Limiter;
- the ``ratelimit`` fixture sets a limit in one line and moves time without sleeping::

      def test_refused_then_refilled(client, ratelimit):
          ratelimit.limit("2/min")
          assert [client.get("/api/").status_code for _ in range(3)] == [200, 200, 429]
          ratelimit.advance(30)  # one token back
          assert client.get("/api/").status_code == 200

- ``@pytest.mark.ratelimit_off`` (or the ``ratelimit_off`` fixture) lets every request of a
  test through; ``RATELIMIT_APP["ENABLED"] = False`` in the test settings does so for all tests
  but those using the ``ratelimit`` fixture.

The plugin loads only where a conftest names it, so it changes nothing in other suites.
"""

import os
import re
import shutil
import tempfile
import time

import pytest
import redis
from django.conf import settings
from django.test import override_settings

from .runtime.limiter import default_limiter, install_limiter
from .stores import embedded

__all__ = ["RateLimits", "TestClock", "parse_rate"]

# DRF's rate words (it reads only the first letter; "month" is not taken for a minute here)
PERIOD_UNITS_S = {**dict.fromkeys(["s", "sec", "second", "seconds"], 1),
                  **dict.fromkeys(["m", "min", "minute", "minutes"], 60),
                  **dict.fromkeys(["h", "hour", "hours"], 3600),
                  **dict.fromkeys(["d", "day", "days"], 86400)}
RATE_PATTERN = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([a-zA-Z]+)\s*$")


def parse_rate(rate):
    """Return ``(tokens, period_s)`` of a rate written as DRF writes it ("5/min", "100/hour",
    "10/s", "1000/day"; also "5/10s": five per ten seconds). Raises ValueError."""
    match = RATE_PATTERN.match(rate) if isinstance(rate, str) else None
    unit = match and PERIOD_UNITS_S.get(match.group(3).lower())
    if not unit:
        raise ValueError(f"rate {rate!r}: write it as N/unit, e.g. '5/min', '100/hour', '10/s'")
    return int(match.group(1)), int(match.group(2) or 1) * unit


class TestClock:
    """Test time for the Limiter (the clock seam, decision/clock.py): the scripts take their
    "now" from here instead of the server's clock, and so do the deny cache and breaker.
    Starts at the real time; only ``advance`` moves it."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, now_s=None):
        self.now_ms = int((time.time() if now_s is None else now_s) * 1000)

    def advance(self, seconds):
        self.now_ms += int(seconds * 1000)

    def redis_now_ms(self):
        return self.now_ms

    def monotonic(self):
        return self.now_ms / 1000

    def wall_time(self):
        return self.now_ms / 1000


class RateLimits:
    """What the ``ratelimit`` fixture gives a test: limits in one line, and time to move."""

    def __init__(self, server_url):
        self.clock = TestClock()
        self.server_url = server_url
        self._count = 0

    def limit(self, rate=None, *, period_s=None, burst=None, scope="ip", endpoint="",
              plan=None, name=None):
        """Create a token-bucket Rule and make it apply at once; return the Rule.

        ``rate`` is "N/unit" ("5/min"), or a number of tokens with ``period_s``; ``burst``
        defaults to the rate (all of it usable at once). ``scope``: "ip" (each client address;
        the default, so the test client is limited), "user", "tenant", "plan" or "global";
        ``endpoint`` the URL name of one view (empty: every endpoint); ``plan`` a Plan or its
        slug (empty: every plan).
        """
        from .config.models import Plan, Rule

        if isinstance(rate, str):
            if period_s is not None:
                raise ValueError("give the rate as 'N/unit' or as rate=N with period_s, not both")
            rate, period_s = parse_rate(rate)
        elif rate is None or period_s is None:
            raise ValueError("give a rate: limit('5/min'), or limit(rate=5, period_s=60)")
        if isinstance(plan, str):
            plan = Plan.objects.get(slug=plan)
        self._count += 1
        rule = Rule(name=name or f"test-limit-{self._count}", rate=rate, period_s=period_s,
                    burst=burst or rate, scope=scope, endpoint=endpoint, plan=plan)
        rule.full_clean()
        rule.save()
        self.publish()
        return rule

    def publish(self):
        """Apply the quota rows as they are now (a test's transaction never commits, so the
        commit that announces an edit in production never comes)."""
        default_limiter().bump_config_version()

    def advance(self, seconds):
        """Move the Limiter's time forward by ``seconds``: buckets refill as if they passed."""
        self.clock.advance(seconds)

    def empty_buckets(self):
        """Give every bucket back its full level (what happens before each test)."""
        _empty(self.server_url)
        install_limiter(clock=self.clock, metrics_autostart=False)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "ratelimit_off: every request of this test is let through (ratelimit_app)")


@pytest.fixture(scope="session")
def ratelimit_server():
    """The URL of the session's rate-limit server: REDIS_URL when set (refused unless empty),
    else a private embedded server, stopped at the session's end."""
    url, server, run_dir = os.environ.get("REDIS_URL"), None, None
    if url:
        with redis.Redis.from_url(url) as client:
            if client.dbsize():
                raise pytest.UsageError(
                    f"REDIS_URL={url} holds data, and the ratelimit_app plugin empties it before "
                    f"every test: point REDIS_URL at an empty database, or unset it to use the "
                    f"embedded server")
    else:
        run_dir = tempfile.mkdtemp(prefix="ratelimit-test-")
        server = embedded.EmbeddedServer(run_dir, owner_pid=os.getpid())
        url = server.ensure_running()
    embedded.point_at(url)
    user_settings = getattr(settings, "RATELIMIT_APP", None) or {}
    with override_settings(RATELIMIT_APP={**user_settings, "EMBEDDED_SERVER": True}):
        yield url
    embedded.point_at(None)
    install_limiter()  # let go of the server's connections
    if server is not None:
        server.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def _empty(url):
    with redis.Redis.from_url(url) as client:
        client.flushdb()


@pytest.fixture(autouse=True)
def _ratelimit_fresh(request, ratelimit_server):
    """Every test: empty buckets, a new Limiter (no state of the test before), and limiting
    off under the ``ratelimit_off`` marker."""
    _empty(ratelimit_server)
    # no background flush writing behind a test's back
    install_limiter(metrics_autostart=False)
    if request.node.get_closest_marker("ratelimit_off") is None:
        yield
        return
    with override_settings(RATELIMIT_APP={**settings.RATELIMIT_APP, "ENABLED": False}):
        yield


@pytest.fixture
def ratelimit_off(_ratelimit_fresh):
    """Let every request of this test through (as the ``ratelimit_off`` marker does)."""
    with override_settings(RATELIMIT_APP={**settings.RATELIMIT_APP, "ENABLED": False}):
        yield


@pytest.fixture
def ratelimit(_ratelimit_fresh, ratelimit_server, db):
    """RateLimits: ``ratelimit.limit("5/min")`` makes a limit apply at once,
    ``ratelimit.advance(60)`` moves the Limiter's time (limiting is on for this test, whatever
    the ENABLED setting says)."""
    limits = RateLimits(ratelimit_server)
    with override_settings(RATELIMIT_APP={**settings.RATELIMIT_APP, "ENABLED": True}):
        install_limiter(clock=limits.clock, metrics_autostart=False)
        yield limits
