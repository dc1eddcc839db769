"""Suite-wide fixtures: a private redis-server for the whole session, flushed between tests."""

import os

import pytest
from django.test import override_settings

from ratelimit_app import metrics, policy, storage
from ratelimit_app.deny_cache import deny_cache
from ratelimit_app.testing import RedisServer

# the Cluster and Sentinel fixtures (started only by the tests that use them)
pytest_plugins = ["tests.topologies"]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def redis_server():
    """The suite's own redis-server on a free 127.0.0.1 port (stopped at the end)."""
    server = RedisServer().start()
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
    storage.reset()
    policy.reset()
    deny_cache.clear()
    metrics.reset(background=False)  # tests flush with metrics.flusher.flush_now()
    yield


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
