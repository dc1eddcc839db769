"""A bucket a request is charged against, and the status it reports after a decision.

Units (shared with ``lua/take.lua``): one token is ``period_ms`` units, so a rule of ``rate``
tokens per period refills exactly ``rate`` units per millisecond and all math stays in integers.
"""

import math
from dataclasses import dataclass

__all__ = ["Bucket", "PolicyStatus"]


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """The state of one bucket after a decision, as the headers and the dashboard show it."""

    name: str
    quota: int          # tokens per window (the rule's rate)
    window_s: int       # the rule's period
    burst: int
    remaining: int      # whole tokens left
    reset_s: int        # seconds until more quota is available (enough for this request, if short)
    full_s: int         # seconds until the bucket is full again
    cost: int
    shadow: bool
    short: bool         # did not hold the cost (a denial, or a would-be denial if shadow)
    key: str
    level_units: int    # exact level in the script's units


@dataclass(frozen=True, slots=True)
class Bucket:
    """One rule's bucket for one scope value, and the tokens this request costs in it."""

    rule: object        # policy.CompiledRule
    key: str
    cost: int           # tokens

    @property
    def period_ms(self):
        return self.rule.period_s * 1000

    @property
    def capacity_units(self):
        return self.rule.burst * self.rule.period_s * 1000

    def lua_args(self):
        """The five script arguments: period_ms, capacity, refill per ms, cost, enforce."""
        period_ms = self.period_ms
        return (period_ms, self.rule.burst * period_ms, self.rule.rate, self.cost * period_ms,
                0 if self.rule.shadow else 1)

    def status(self, level_units, short):
        """Return the PolicyStatus of this bucket holding ``level_units``."""
        rule = self.rule
        period_ms, refill = self.period_ms, rule.rate
        capacity = rule.burst * period_ms
        if short:
            wait_ms = (self.cost * period_ms - level_units) / refill
        elif level_units < capacity:
            wait_ms = (period_ms - level_units % period_ms) / refill  # until the next whole token
        else:
            wait_ms = 0
        return PolicyStatus(
            name=rule.name, quota=rule.rate, window_s=rule.period_s, burst=rule.burst,
            remaining=int(level_units // period_ms), reset_s=math.ceil(wait_ms / 1000),
            full_s=math.ceil(max(0, capacity - level_units) / refill / 1000), cost=self.cost,
            shadow=rule.shadow, short=short, key=self.key, level_units=int(level_units),
        )
