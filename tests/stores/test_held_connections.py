"""The connections decisions run on (stores/connections.HeldConnections), against the suite's
real redis-server: reused without the pool's checkout, never shared by two calls at once, never
carrying a late reply into the next call, reopened when Redis closed them, given back when their
store is replaced, and never used by a forked child; calls on plain connections go through a Wire
(error replies raised as redis-py's exceptions, RESP3 push messages skipped), others through the
connection's own methods; a Wire keeps the connection's timeout in the kernel, and gives it
back."""

import os
import socket
import struct
import threading
import time
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory
from django_redis import get_redis_connection
from redis import ConnectionPool
from redis.connection import Connection
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

from ratelimit_app.metrics import WAIT_BATCH
from ratelimit_app.models import Plan, Rule, Scope
from ratelimit_app.runtime import guard
from ratelimit_app.runtime.limiter import install_limiter
from ratelimit_app.stores.connections import HeldConnections, Wire

from ..helpers import decide, limiter, poll_until

pytestmark = pytest.mark.django_db

CLIENT_ID = Connection().pack_command("CLIENT", "ID")


@pytest.fixture
def anonymous_plan(settings):
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP, "CONFIG_CHECK_INTERVAL_S": 3600}
    plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
    Rule.objects.create(name="small", plan=plan, scope=Scope.IP, endpoint="small", rate=1,
                        period_s=60, burst=5)
    Rule.objects.create(name="large", plan=plan, scope=Scope.IP, endpoint="large", rate=1,
                        period_s=60, burst=9)
    return plan


def decide_as(address, endpoint):
    return decide(RequestFactory().get("/", REMOTE_ADDR=address), AnonymousUser(), endpoint)


def connections_opened(redis_client):
    return redis_client.info("stats")["total_connections_received"]


def test_sequential_decisions_and_short_lived_threads_share_one_connection(anonymous_plan,
                                                                          redis_client):
    assert decide_as("10.0.0.1", "small").allowed  # warm: the one connection is open
    opened = connections_opened(redis_client)
    for _ in range(5):
        assert decide_as("10.0.0.1", "small").policies  # answered by Redis
    # a thread per request (runserver): each finds the idle connection, none is left behind
    for i in range(20):
        thread = threading.Thread(target=decide_as, args=(f"10.0.1.{i}", "small"))
        thread.start()
        thread.join()
    assert connections_opened(redis_client) == opened


def test_a_new_callers_call_is_encoded_without_opening_a_connection(anonymous_plan,
                                                                   redis_client):
    """Encoding a call needs no socket: with no idle connection left in the pool (here: reset),
    new callers' decisions run on the held connection and open none."""
    assert decide_as("10.0.2.1", "small").allowed  # warm: the held connection is open
    get_redis_connection("default").connection_pool.reset()
    opened = connections_opened(redis_client)
    for i in range(2, 6):
        assert decide_as(f"10.0.2.{i}", "small").policies  # each a new call to encode
    assert connections_opened(redis_client) == opened


def test_concurrent_decisions_never_share_a_connection(anonymous_plan, redis_client):
    threads_n, rounds = 6, 20
    assert decide_as("10.0.2.99", "small").allowed  # the rules are loaded (the test's database
    # transaction is this thread's)
    barrier = threading.Barrier(threads_n)
    remaining, errors = {}, []

    def run(index):
        try:
            barrier.wait(timeout=10)
            endpoint = "small" if index % 2 else "large"
            remaining[index] = [decide_as(f"10.0.2.{index}", endpoint).policies[0].remaining
                                for _ in range(rounds)]
        except Exception as exc:  # reported below, with the thread's index
            errors.append((index, exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # each thread read the replies of its own calls: its own bucket, counting down from its
    # own burst (a reply read on a shared socket would belong to another thread's bucket)
    for index, seen in remaining.items():
        burst = 5 if index % 2 else 9
        assert seen[:burst] == list(range(burst - 1, -1, -1))
    assert len(limiter().store._connections._idle) <= threads_n


def test_a_reply_that_came_too_late_is_never_read_as_the_next_one(anonymous_plan, redis_client):
    assert decide_as("10.0.3.1", "small").policies[0].remaining == 4
    redis_client.client_pause(1000, all=False)  # our script waits; the socket times out
    try:
        assert decide_as("10.0.3.1", "small").degraded == "fail-open"
    finally:
        redis_client.client_unpause()
    # another bucket (burst 9): a late reply of the call above would show the small one's level
    assert decide_as("10.0.3.2", "large").policies[0].remaining == 8
    assert decide_as("10.0.3.2", "large").policies[0].remaining == 7


def test_a_connection_redis_closed_while_idle_is_reopened(redis_client):
    pool = get_redis_connection("default").connection_pool
    held = HeldConnections(pool, recheck_after_s=0)  # every reuse counts as idle
    first = held.request(CLIENT_ID)
    redis_client.client_kill_filter(_id=first)
    second = held.request(CLIENT_ID)  # no error: the closed socket was noticed and replaced
    assert second != first
    assert held.request(CLIENT_ID) == second


def test_a_connection_that_failed_is_dropped_and_the_next_call_reconnects(redis_client):
    pool = get_redis_connection("default").connection_pool
    held = HeldConnections(pool, recheck_after_s=3600)  # never checked: the call finds out
    first = held.request(CLIENT_ID)
    redis_client.client_kill_filter(_id=first)
    with pytest.raises(ConnectionError):
        held.request(CLIENT_ID)
    assert held._idle == []  # not put back
    assert held.request(CLIENT_ID) not in (first, None)


def test_a_replaced_store_gives_its_connection_back(anonymous_plan, redis_client):
    assert decide_as("10.0.4.1", "small").allowed
    opened = connections_opened(redis_client)
    for i in range(10):
        limiter().close()
        install_limiter(metrics_autostart=False)
        assert decide_as(f"10.0.4.{i}", "small").policies
    # each new store took the connection its predecessor gave back to django-redis's pool
    assert connections_opened(redis_client) == opened


def test_a_forked_child_opens_its_own_connection(redis_client):
    pool = get_redis_connection("default").connection_pool
    held = HeldConnections(pool)
    parent_id = held.request(CLIENT_ID)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the connection it used, then leave without cleanup
        try:
            os.write(write_end, str(held.request(CLIENT_ID)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child_id = int(pipe.read() or 0)
    os.waitpid(pid, 0)
    assert child_id not in (0, parent_id)
    assert held.request(CLIENT_ID) == parent_id  # the parent's socket is untouched


def test_plain_connections_are_served_by_a_wire_and_error_replies_keep_them(redis_client):
    pool = get_redis_connection("default").connection_pool
    held = HeldConnections(pool)
    first = held.request(CLIENT_ID)
    (_, _, wire, _), = held._idle
    assert isinstance(wire, Wire) and wire.sock is not None
    with pytest.raises(NoScriptError):  # redis-py's exception, as store.take expects
        held.request(Connection().pack_command("EVALSHA", "0" * 40, 0))
    with pytest.raises(ResponseError, match="unknown command"):
        held.request(Connection().pack_command("NO-SUCH-COMMAND"))
    assert held.request(CLIENT_ID) == first  # an error reply leaves the connection usable
    assert held.request(Connection().pack_command("ECHO", b"x" * 40000)) == b"x" * 40000


def test_while_waiting_runs_once_the_command_has_reached_redis(
        redis_client):
    """The gap it fills is real: when ``while_waiting`` runs, the command has been written and
    Redis executes it (a second client sees its write; run before the write, this would time
    out), and the request still returns the command's reply."""
    pool = get_redis_connection("default").connection_pool
    seen_while_waiting = []

    def while_waiting():
        poll_until(lambda: redis_client.exists("waited"), what="the INCR to reach Redis")
        seen_while_waiting.append(redis_client.get("waited"))

    for wire_or_not in (pool, ConnectionPool(connection_class=ConnectionOfAnotherKind,
                                             host="127.0.0.1",
                                             port=pool.connection_kwargs["port"])):
        redis_client.delete("waited")
        held = HeldConnections(wire_or_not)
        held.while_waiting = while_waiting
        assert held.request(Connection().pack_command("INCR", "waited")) == 1
        held.give_back()
    assert seen_while_waiting == [b"1", b"1"]  # the wire, then a connection's own methods


def test_decisions_are_counted_in_batches_while_a_decision_waits_for_redis(anonymous_plan):
    recorder = limiter().recorder
    for i in range(WAIT_BATCH):
        assert guard_decide(f"10.0.5.{i}").allowed
    assert recorder.queued() == WAIT_BATCH  # not counted yet: nothing has waited since
    guard_decide("10.0.5.99")
    # the batch was counted during the last decision's wait for Redis; only its own is queued
    assert recorder.queued() == 1
    assert recorder.counts()[("endpoint", "small", "allowed")] == WAIT_BATCH + 1


def test_a_fault_while_counting_fails_no_decision_and_is_counted(anonymous_plan, monkeypatch):
    for i in range(WAIT_BATCH):
        guard_decide(f"10.0.6.{i}")

    def broken_count(now, decision):
        raise TypeError("a bug in counting")
    monkeypatch.setattr(limiter().recorder, "_count", broken_count)
    assert guard_decide("10.0.6.99").policies  # answered by Redis despite the fault
    assert limiter().stats.unexpected_by_type == {"TypeError": 1}


def guard_decide(address):
    """Decide as the adapters do (guard.decide: the decision is also recorded)."""
    request = RequestFactory().get("/", REMOTE_ADDR=address)
    request.resolver_match = SimpleNamespace(view_name="small", func=None)
    return guard.decide(request, AnonymousUser())


class ConnectionOfAnotherKind(Connection):
    """Stands for a connection class the wire does not know (Sentinel's, a caching proxy)."""

    calls = 0

    def read_response(self, *args, **kwargs):
        ConnectionOfAnotherKind.calls += 1
        return super().read_response(*args, **kwargs)


def test_other_connection_classes_are_served_by_their_own_methods(redis_server):
    pool = ConnectionPool(connection_class=ConnectionOfAnotherKind, host="127.0.0.1",
                          port=redis_server.port)
    held = HeldConnections(pool)
    try:
        first = held.request(CLIENT_ID)  # (the handshake's replies are read its way too)
        calls = ConnectionOfAnotherKind.calls
        assert held.request(CLIENT_ID) == first
        assert held._idle[0][2] is None and ConnectionOfAnotherKind.calls == calls + 1
    finally:
        held.give_back()
        pool.disconnect()


def test_a_resp3_push_message_before_a_reply_is_skipped(redis_server, redis_client):
    # RESP3 lets the server push messages between replies (redis-py asks for maintenance
    # notices); a client-tracking invalidation is one Redis 7 sends on demand
    pool = ConnectionPool(host="127.0.0.1", port=redis_server.port, protocol=3)
    held = HeldConnections(pool)
    pack = Connection().pack_command
    try:
        assert held.request(pack("CLIENT", "TRACKING", "ON")) == b"OK"
        held.request(pack("GET", "held:tracked"))  # the connection now tracks the key
        redis_client.set("held:tracked", "changed")  # Redis pushes an invalidation to it
        assert held.request(pack("ECHO", "the reply")) == b"the reply"
        assert isinstance(held._idle[0][2], Wire)
    finally:
        held.give_back()
        pool.disconnect()
        redis_client.delete("held:tracked")


def kernel_timeout_s(sock, option):
    seconds, microseconds = struct.unpack("ll", sock.getsockopt(socket.SOL_SOCKET, option, 16))
    return seconds + microseconds / 1_000_000


def test_a_wire_times_out_in_the_kernel_and_gives_the_timeout_back(redis_server, redis_client):
    """The connection's socket_timeout moves into the kernel (the socket blocks without
    CPython's poll), still bounds a call to a stalled Redis, is taken again after redis-py set
    it back, and is handed back to the pool with the connection."""
    pool = ConnectionPool(host="127.0.0.1", port=redis_server.port, socket_timeout=0.3)
    held = HeldConnections(pool, recheck_after_s=3600)
    try:
        first = held.request(CLIENT_ID)
        connection, _, wire, _ = held._idle[0]
        sock = wire.sock
        assert sock.gettimeout() is None  # blocking: no poll before each send and receive
        assert kernel_timeout_s(sock, socket.SO_RCVTIMEO) == pytest.approx(0.3)
        assert kernel_timeout_s(sock, socket.SO_SNDTIMEO) == pytest.approx(0.3)

        # redis-py may set a timeout again (older parsers' can_read; a relaxed timeout while
        # the server announces maintenance): the next call moves that one into the kernel
        assert connection.can_read() is False
        sock.settimeout(0.4)
        assert held.request(CLIENT_ID) == first
        assert sock.gettimeout() is None
        assert kernel_timeout_s(sock, socket.SO_RCVTIMEO) == pytest.approx(0.4)
        sock.settimeout(0.3)
        assert held.request(CLIENT_ID) == first

        # writes wait for 3 s (CLIENT UNPAUSE, not a write, still gets through)
        redis_client.client_pause(3000, all=False)
        try:
            started = time.monotonic()
            with pytest.raises(TimeoutError):  # redis-py's, as for a Python socket timeout
                held.request(Connection().pack_command("INCR", "held:paused"))
            assert 0.25 <= time.monotonic() - started < 2
        finally:
            redis_client.client_unpause()
            redis_client.delete("held:paused")
        assert held._idle == []  # a call that timed out never leaves its socket in use

        second = held.request(CLIENT_ID)
        connection, _, wire, _ = held._idle[0]
        assert second != first and wire.sock.gettimeout() is None
        held.give_back()
        assert connection._sock.gettimeout() == 0.3  # redis-py gets the socket it set up
        assert pool.get_connection() is connection
        pool.release(connection)
    finally:
        held.give_back()
        pool.disconnect()


def test_a_connection_without_a_timeout_is_left_as_it_is(redis_server):
    pool = ConnectionPool(host="127.0.0.1", port=redis_server.port, socket_timeout=None)
    held = HeldConnections(pool)
    try:
        held.request(CLIENT_ID)
        (_, _, wire, _), = held._idle
        assert wire.timeout is None and wire.sock.gettimeout() is None
        assert kernel_timeout_s(wire.sock, socket.SO_RCVTIMEO) == 0  # none set
    finally:
        held.give_back()
        pool.disconnect()
