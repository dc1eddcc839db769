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
