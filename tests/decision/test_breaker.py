"""CircuitBreaker: closed → open → half-open (one trial) → closed or open, on an injected clock."""

from ratelimit_app.decision.breaker import CircuitBreaker


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def open_breaker(failures=3, cooldown_s=2.0):
    clock = FakeClock()
    breaker = CircuitBreaker(failures, cooldown_s, clock=clock)
    for _ in range(failures):
        assert breaker.allow_call()
        breaker.record_failure()
    return breaker, clock


def test_stays_closed_below_the_failure_threshold():
    breaker = CircuitBreaker(3, 2.0, clock=FakeClock())
    for _ in range(2):
        breaker.record_failure()
    assert breaker.state == CircuitBreaker.CLOSED
    assert breaker.allow_call()
    assert breaker.times_opened == 0


def test_a_success_resets_the_consecutive_failure_count():
    breaker = CircuitBreaker(3, 2.0, clock=FakeClock())
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state == CircuitBreaker.CLOSED


def test_opens_after_the_threshold_and_refuses_calls_during_the_cooldown():
    breaker, clock = open_breaker(failures=3, cooldown_s=2.0)
    assert breaker.state == CircuitBreaker.OPEN
    assert breaker.times_opened == 1
    assert not breaker.allow_call()
    clock.now += 1.999
    assert not breaker.allow_call()
    assert breaker.state == CircuitBreaker.OPEN


def test_after_the_cooldown_exactly_one_trial_call_is_let_through():
    breaker, clock = open_breaker(cooldown_s=2.0)
    clock.now += 2.0
    assert breaker.state == CircuitBreaker.HALF_OPEN
    assert breaker.allow_call()          # the trial
    assert not breaker.allow_call()      # everyone else waits for its outcome
    assert not breaker.allow_call()
    assert breaker.state == CircuitBreaker.HALF_OPEN


def test_a_successful_trial_closes_the_breaker():
    breaker, clock = open_breaker()
    clock.now += 2.0
    assert breaker.allow_call()
    breaker.record_success()
    assert breaker.state == CircuitBreaker.CLOSED
    assert all(breaker.allow_call() for _ in range(5))
    # and it needs the full threshold again to reopen
    breaker.record_failure()
    assert breaker.state == CircuitBreaker.CLOSED


def test_a_failed_trial_reopens_for_a_full_cooldown():
    breaker, clock = open_breaker(cooldown_s=2.0)
    clock.now += 5.0
    assert breaker.allow_call()
    breaker.record_failure()             # one failure is enough while half-open
    assert breaker.state == CircuitBreaker.OPEN
    assert breaker.times_opened == 2
    clock.now += 1.5
    assert not breaker.allow_call()      # the cooldown restarted at the failed trial
    clock.now += 0.5
    assert breaker.allow_call()


def test_failures_while_open_do_not_count_as_new_openings():
    breaker, _clock = open_breaker()
    breaker.record_failure()             # e.g. a call that was already in flight
    breaker.record_failure()
    assert breaker.times_opened == 1
    assert breaker.state == CircuitBreaker.OPEN


def test_threshold_and_cooldown_are_sanitised():
    breaker = CircuitBreaker(0, "1.5", clock=FakeClock())
    assert breaker.failures_to_open == 1
    assert breaker.cooldown_s == 1.5
    breaker.record_failure()
    assert breaker.state == CircuitBreaker.OPEN
