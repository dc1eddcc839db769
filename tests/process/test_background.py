"""background.WorkerThread: the thread behind the alerts' drain and the comparison of the quota
rows. Real threads; the tests wait on events and poll with a deadline."""

import threading

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
