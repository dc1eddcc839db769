"""background.WorkerThread: the thread behind the alerts' drain and the comparison of the quota
rows. Real threads; the tests wait on events and poll with a deadline."""

import gc
import os
import threading
import warnings
import weakref

import pytest
from django.db import connections
from django.db.backends.signals import connection_created

from ratelimit_app.process.background import WorkerThread

from ..helpers import poll_until


class Work:
    """A piece of work that counts its rounds and fails in the rounds listed in ``failing``."""

    def __init__(self, failing=()):
        self.rounds = 0
        self.failing = set(failing)
        self.threads = set()

    def __call__(self):
        self.rounds += 1
        self.threads.add(threading.current_thread().name)
        if self.rounds in self.failing:
            raise RuntimeError(f"round {self.rounds} fails")


def test_a_wake_runs_the_work_in_the_named_thread_started_on_demand():
    work = Work()
    thread = WorkerThread(work, "test-worker")
    assert not thread.running and work.rounds == 0  # nothing runs before the first wake
    try:
        thread.wake()
        poll_until(lambda: work.rounds == 1, what="the first round")
        thread.wake()
        poll_until(lambda: work.rounds == 2, what="the second round")
        assert work.threads == {"test-worker"}
    finally:
        thread.stop()
    assert not thread.running and work.rounds == 2  # no round at stop without final_round


def test_final_round_runs_the_work_once_more_at_stop():
    work = Work()
    thread = WorkerThread(work, "test-drain", final_round=True)
    thread.wake()
    poll_until(lambda: work.rounds == 1, what="the first round")
    thread.stop()
    assert not thread.running and work.rounds == 2


def test_a_failing_round_is_logged_and_the_thread_goes_on(caplog):
    work = Work(failing={1})
    thread = WorkerThread(work, "test-failing")
    try:
        thread.wake()
        poll_until(lambda: work.rounds == 1 and "round 1 fails" in caplog.text,
                   what="the failing round to be logged")
        assert "test-failing failed" in caplog.text
        thread.wake()
        poll_until(lambda: work.rounds == 2, what="the round after the failure")
        assert thread.running
    finally:
        thread.stop()


def test_every_s_runs_the_work_without_a_wake():
    work = Work()
    thread = WorkerThread(work, "test-every", every_s=lambda: 0.01)
    try:
        thread.ensure_running()
        poll_until(lambda: work.rounds >= 3, what="three rounds on the interval alone")
    finally:
        thread.stop()


# --- the thread's database connections ----------------------------------------------------------

@pytest.fixture
def own_database(tmp_path, django_db_blocker):
    """A database alias of the test's own, on a real connection that a close really closes (the
    test database, SQLite's in memory, is never closed): a file for SQLite, the server's
    maintenance database for PostgreSQL (the test reads nothing of it). Yields its alias, a
    list of the driver's connections opened on it, and weak references to the Django
    connections that opened them."""
    alias = "background_test"
    settings = dict(connections.settings["default"])
    if settings["ENGINE"].endswith("sqlite3"):
        settings["NAME"] = str(tmp_path / "background.sqlite3")
    else:
        settings["NAME"] = "postgres"
    connections.settings[alias] = settings
    opened, wrappers = [], []

    def note(sender, connection, **kwargs):
        if connection.alias == alias:
            opened.append(connection.connection)
            wrappers.append(weakref.ref(connection))

    connection_created.connect(note)
    try:
        with django_db_blocker.unblock():  # not the test database: no test case to isolate
            yield alias, opened, wrappers
    finally:
        connection_created.disconnect(note)
        connections[alias].close()
        del connections.settings[alias]


def query_work(alias, failing=()):
    """Work that queries ``alias``, with a failing query in the rounds listed in ``failing``."""
    rounds = []

    def work():
        rounds.append(None)
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM no_such_table" if len(rounds) in failing
                           else "SELECT 1")

    return work, rounds


def connection_closed(connection):
    """True when a driver's connection (sqlite3's or psycopg's) is closed."""
    if hasattr(connection, "closed"):
        return bool(connection.closed)
    try:
        connection.execute("SELECT 1")
    except Exception as exc:  # sqlite3.ProgrammingError: "Cannot operate on a closed database"
        return "closed" in str(exc)
    return False


def run_rounds(thread, rounds, count):
    try:
        for number in range(1, count + 1):
            thread.wake()
            poll_until(lambda: len(rounds) == number, what=f"round {number}")
    finally:
        thread.stop()


def test_the_thread_closes_its_connections_after_each_round_by_default(own_database):
    alias, opened, _ = own_database
    work, rounds = query_work(alias)
    run_rounds(WorkerThread(work, "test-close"), rounds, 3)
    assert len(opened) == 3  # connected again in each round


def test_keep_connections_s_keeps_them_between_rounds_but_not_after_an_error(own_database,
                                                                             caplog):
    alias, opened, _ = own_database
    work, rounds = query_work(alias, failing={4})
    run_rounds(WorkerThread(work, "test-keep", keep_connections_s=60.0), rounds, 5)
    # round 1's is closed at once (the first release closes everything and starts the count),
    # round 2's serves rounds 3 and 4; round 4's query fails, so round 5 connects again
    assert len(opened) == 3, opened
    assert "no_such_table" in caplog.text
    # and the one kept when the thread stopped was closed with it
    assert all(connection_closed(connection) for connection in opened)


def test_kept_connections_are_closed_once_keep_connections_s_has_passed(own_database):
    alias, opened, _ = own_database
    work, rounds = query_work(alias)
    run_rounds(WorkerThread(work, "test-expire", keep_connections_s=0.0001), rounds, 3)
    assert len(opened) == 3


def test_a_child_forked_while_a_connection_is_kept_neither_uses_nor_frees_it(own_database):
    """A fork clears the child's copy of every other thread's locals, which frees what they
    held, and the child's own thread would drop what the parent's kept: a connection whose
    freeing (psycopg2's) would end the parent's session on the socket both share. The child
    keeps it aside, unused."""
    alias, opened, wrappers = own_database
    work, rounds = query_work(alias)
    thread = WorkerThread(work, "test-fork", keep_connections_s=60.0)
    try:
        for number in (1, 2):  # round 1's connection is closed, round 2's kept
            thread.wake()
            poll_until(lambda: len(rounds) == number, what=f"round {number}")
        kept = wrappers[-1]
        with warnings.catch_warnings():  # (3.12+: "multi-threaded, fork() may deadlock")
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child: a round of its own thread, a report, and out without cleanup
            code = 3
            try:
                thread.wake()
                poll_until(lambda: len(rounds) == 3, what="the child's round")
                gc.collect()
                code = 0 if kept() is not None and not connection_closed(kept().connection) \
                    else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # still there, and still open
        thread.wake()
        poll_until(lambda: len(rounds) == 3, what="the parent's next round")
        assert len(opened) == 2  # which the parent's kept connection served
    finally:
        thread.stop()
