"""bench/servers.py: each gunicorn runs without gunicorn's shared control socket in $HOME, so two
servers (or two bench runs) never collide on it."""

import os
import urllib.request

import pytest

from bench.servers import Gunicorn, cpu_seconds

from .helpers import poll_until


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


def test_a_servers_workers_cpu_is_read_from_proc(own_home):
    # the HTTP section's CPU per request: the workers' CPU, not the master's
    server = Gunicorn("none", workers=2)
    try:
        server.start()
        poll_until(lambda: len(server.worker_pids()) == 2)  # the master forks them in turn
        workers = server.worker_pids()
        assert server.process.pid not in workers
        before = sum(map(cpu_seconds, workers))
        for _ in range(300):
            with urllib.request.urlopen(server.url(), timeout=5) as response:
                assert response.status == 200
        assert sum(map(cpu_seconds, workers)) > before  # 300 requests take some CPU
    finally:
        server.stop()
    assert cpu_seconds(workers[0]) == 0.0  # a process that is gone
