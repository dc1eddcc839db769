"""bench/servers.py: each gunicorn runs without gunicorn's shared control socket in $HOME, so two
servers (or two bench runs) never collide on it."""

import os
import urllib.request

import pytest

from bench.servers import Gunicorn


@pytest.fixture
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # where gunicorn would put its default socket
    monkeypatch.setenv("BENCH_SQLITE_PATH", str(tmp_path / "bench.sqlite3"))
    return tmp_path


def test_two_bench_servers_run_side_by_side_without_a_control_socket(own_home):
    servers = [Gunicorn("none", workers=1), Gunicorn("none", workers=1)]
    try:
        for server in servers:
            server.start()
        workdirs = [server.workdir for server in servers]
        assert len(set(workdirs)) == 2
        for server in servers:
            with urllib.request.urlopen(server.url(), timeout=5) as response:
                assert response.status == 200
            assert "--no-control-socket" in server.process.args
    finally:
        for server in servers:
            server.stop()
    assert not (own_home / ".gunicorn").exists()
    assert not any(os.path.exists(path) for path in workdirs)  # each stop removed its dir
