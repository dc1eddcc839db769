"""The long-running commands' stop request: a signal may arrive at any point of ``wait`` and
must still stop the loop at once (a ``threading.Event`` set from the handler deadlocks when the
signal lands while ``Event.wait`` holds the Event's own lock)."""

import os
import signal
import sys
import threading
import time

import pytest

from ratelimit_app.process.stop_signal import StopSignal


@pytest.fixture
def stop():
    stop = StopSignal(signals=(signal.SIGUSR1,))
    yield stop
    stop.close()


def tracer_of(function, signal_at_line=None):
    """Return ``(tracer for sys.settrace, lines)``: ``lines()`` is how many lines of
    ``function``'s own frames ran under the tracer; at the ``signal_at_line``-th, it sends this
    process SIGUSR1, whose handler runs at the next bytecode boundary, in the middle of
    ``function``."""
    seen = 0

    def trace(frame, event, arg):
        nonlocal seen
        if event == "line":
            if seen == signal_at_line:
                os.kill(os.getpid(), signal.SIGUSR1)
            seen += 1
        return trace

    def tracer(frame, event, arg):
        return trace if frame.f_code is function.__code__ else None

    return tracer, lambda: seen


def test_waits_out_its_timeout_when_no_signal_comes(stop):
    started = time.monotonic()
    assert stop.wait(0.05) is False
    assert time.monotonic() - started >= 0.05
    assert not stop.is_set()


def test_a_signal_during_the_wait_ends_it_at_once(stop):
    sender = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1))
    sender.start()
    started = time.monotonic()
    assert stop.wait(30) is True
    assert time.monotonic() - started < 10
    assert stop.is_set()
    sender.join()


def test_a_signal_before_the_wait_is_not_lost(stop):
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.wait(30) is True  # returns at once: no timeout to wait out


def test_a_signal_at_any_line_of_the_wait_stops_it_without_deadlock():
    """The signal lands at each line of ``wait`` before its last (the return, after the
    waiting) in turn, including just before the select. A handler that took a lock ``wait``
    holds would hang here; one that set a flag ``wait`` had already read would leave it waiting
    out its 30 s."""
    probe = StopSignal(signals=(signal.SIGUSR1,))
    tracer, lines = tracer_of(StopSignal.wait)
    sys.settrace(tracer)
    try:
        probe.wait(0)
    finally:
        sys.settrace(None)
        probe.close()
    line_count = lines()
    assert line_count >= 2
    for line_index in range(line_count - 1):
        stop = StopSignal(signals=(signal.SIGUSR1,))
        try:
            started = time.monotonic()
            sys.settrace(tracer_of(StopSignal.wait, signal_at_line=line_index)[0])
            try:
                stopped = stop.wait(30)
            finally:
                sys.settrace(None)
            assert stopped is True, line_index
            assert time.monotonic() - started < 10, line_index
        finally:
            stop.close()


def test_close_gives_the_signal_back_its_previous_handler():
    previous = signal.getsignal(signal.SIGUSR1)
    stop = StopSignal(signals=(signal.SIGUSR1,))
    assert signal.getsignal(signal.SIGUSR1) != previous
    stop.close()
    assert signal.getsignal(signal.SIGUSR1) == previous
