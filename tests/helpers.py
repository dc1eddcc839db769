"""Small helpers shared by the tests (plain functions, no factories)."""

from ratelimit_app.buckets import Bucket
from ratelimit_app.keys import bucket_key
from ratelimit_app.policy import CompiledRule

_next_id = iter(range(1, 10**9))


def make_rule(rate=10, period_s=1, burst=10, *, name=None, scope="user", shadow=False,
              endpoint="", plan=None, fail_open=None):
    """Return a CompiledRule with a fresh id."""
    rule_id = next(_next_id)
    return CompiledRule(id=rule_id, name=name or f"rule-{rule_id}", scope=scope, plan=plan,
                        endpoint=endpoint, rate=rate, period_s=period_s, burst=burst,
                        shadow=shadow, fail_open=fail_open)


def make_bucket(rule, cost=1, token="user.test"):
    return Bucket(rule, bucket_key("rl", rule.id, token), cost)


class FakeClock:
    """One test-controlled time for Redis (``now_ms`` given to the script) and the deny cache."""

    def __init__(self, now_ms):
        self.now_ms = now_ms

    def advance(self, ms):
        self.now_ms += ms

    def seconds(self):
        return self.now_ms / 1000


def use_fake_clock(monkeypatch, now_ms=1_700_000_000_000):
    """Make every ``check_request`` run at ``clock.now_ms`` (Redis time) with a fresh deny cache
    reading the same clock, and return the clock."""
    from ratelimit_app import engine
    from ratelimit_app.deny_cache import DenyCache

    clock = FakeClock(now_ms)
    real_take = engine.take

    def take_at_fake_time(buckets, *, now_ms=None, debit=True):
        return real_take(buckets, now_ms=clock.now_ms, debit=debit)

    monkeypatch.setattr(engine, "take", take_at_fake_time)
    monkeypatch.setattr(engine, "deny_cache", DenyCache(clock=clock.seconds))
    return clock


def load_demo_data():
    """Run ``load_demo`` quietly, hashing the demo passwords with a fast (test-only) hasher:
    the users can then sign in only while that hasher is enabled (use ``force_login``)."""
    import io

    from django.core.management import call_command
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        call_command("load_demo", stdout=io.StringIO())
