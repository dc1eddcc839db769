"""bench/servers.py: each gunicorn runs without gunicorn's shared control socket in $HOME, so two
servers (or two bench runs) never collide on it; the ASGI server (bench/asgi_server.py) spreads
kept-alive connections over its workers and turns Nagle's algorithm off on them."""

import asyncio
import http.client
import os
import socket
import urllib.request

import pytest

from bench.asgi_server import listening_socket
from bench.servers import Gunicorn, Uvicorn, cpu_seconds

from ..helpers import poll_until


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


def _established_by_process(pids, port):
    """Return {pid: connections to ``port`` it holds}, read from /proc (no ss needed)."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "01":  # 01: ESTABLISHED
                inodes.add(fields[9])
    held = {}
    for pid in pids:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        held[pid] = sum(link.startswith("socket:[") and link[8:-1] in inodes for link in links)
    return held


def test_the_asgi_servers_workers_share_the_kept_alive_connections(own_home):
    # `uvicorn --workers 2` gave all of wrk's 32 connections to one worker (one shared socket,
    # and asyncio accepts every pending connection at once); a socket per worker spreads them
    server = Uvicorn("none", workers=2)
    connections = []
    try:
        server.start()
        poll_until(lambda: len(server.worker_pids()) == 2)
        for _ in range(32):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
            connection.request("GET", "/aitem/")
            response = connection.getresponse()
            assert response.status == 200
            response.read()
            connections.append(connection)  # kept open: kept alive
        held = _established_by_process(server.worker_pids(), server.port)
        assert sum(held.values()) == 32
        assert min(held.values()) >= 1, held  # all 32 on one worker: 1 in 2**31 by chance
    finally:
        for connection in connections:
            connection.close()
        server.stop()


def test_the_asgi_servers_connections_get_tcp_nodelay():
    # asyncio turns Nagle off only on a connection whose socket says IPPROTO_TCP; uvicorn's
    # own listening socket says 0, and each kept-alive answer then waited for a delayed ACK
    sock = listening_socket("127.0.0.1", 0, backlog=8)
    port = sock.getsockname()[1]
    seen = []

    async def accept_one():
        accepted = asyncio.Event()

        class Report(asyncio.Protocol):
            def connection_made(self, transport):
                sock = transport.get_extra_info("socket")
                seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                accepted.set()
                transport.close()

        server = await asyncio.get_running_loop().create_server(Report, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            await accepted.wait()
            writer.close()

    asyncio.run(asyncio.wait_for(accept_one(), 10))
    assert seen == [1]
