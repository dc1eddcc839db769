"""What a prepaid credit balance shows: its figures, each named for what it counts, in one place.

A balance's state (decision/balances.BalanceState) counts ``used``: every unit consumed in the
allowance's current period, the allowance first and then prepaid units. That is the period's
consumption, not the allowance used: with an allowance of 6 a day and prepaid units, five
requests of cost 3 consume 15 units, 6 of the allowance and 9 prepaid. Every read path (the
staff API, the usage endpoint, ``manage.py ratelimit credits show``, the admin's accounts, the
dashboard) shows the figures worked out here, so they agree with their names and each other:

- the allowance: units per day or month, or given once, of the credits rule that charges the
  account (rules.AccountRules); unknown, and said why, when no rule can be named;
- allowance used = min(used, allowance); allowance left = allowance − allowance used;
- used in the period = used (the period's consumption, allowance and prepaid);
- prepaid left = granted − spent (below 0 only in debt);
- units left = allowance left + prepaid left (what the next requests can spend).

A state of an earlier period (no request since the allowance came back) counts nothing used in
the current one: take.lua counts it so at the next request.
"""

import datetime
from typing import NamedTuple

from ...decision import periods

__all__ = ["Allowance", "CreditFigures"]


class Allowance(NamedTuple):
    """The allowance of an account: ``units`` per ``period`` ("day", "month"; "": given once)
    of the credits rule named ``rule``; ``units`` None when no rule can be named (``unknown``
    says why)."""

    units: int | None
    period: str = ""
    rule: str = ""
    unknown: str = ""

    @classmethod
    def of_rule(cls, rule):
        """Return the allowance of a credits rule (a CompiledRule)."""
        return cls(rule.rate, rule.refill, rule.name)

    @classmethod
    def of_account(cls, rules, ref):
        """Return the allowance of the account ``ref`` under ``rules`` (an AccountRules)."""
        rule, why = rules.find(ref)
        return cls.of_rule(rule) if rule is not None else cls(None, unknown=why)

    @property
    def known(self):
        return self.units is not None

    def per_period(self):
        """Return how the allowance comes: 'a day', 'a month' or 'given once'."""
        return f"a {self.period}" if self.period else "given once"

    def in_words(self):
        """Return the allowance for an operator: '6 units a day (rule “credits”)', 'none
        (rule “credits”: prepaid units only)', or 'unknown: <why>'."""
        if not self.known:
            return f"unknown: {self.unknown}"
        if not self.units:
            return f"none (rule “{self.rule}”: prepaid units only)"
        unit = "unit" if self.units == 1 else "units"
        given = f"{unit} {self.per_period()}" if self.period else f"{unit}, given once"
        return f"{self.units} {given} (rule “{self.rule}”)"


class CreditFigures(NamedTuple):
    """The figures of one balance (see the module's docstring). ``period_start_ms`` is the
    start of the allowance's period they count (0: a never-refilled allowance, whose one
    period has no start); the allowance's figures and ``units_left`` are None when the
    allowance is unknown."""

    allowance: Allowance
    period_start_ms: int
    used_in_period: int
    allowance_used: int | None
    allowance_left: int | None
    prepaid_left: int
    units_left: int | None

    @classmethod
    def of(cls, state, allowance, now_ms=None):
        """Return the figures of ``state`` (a BalanceState) under ``allowance`` at ``now_ms``
        (default: the process's clock, a test's when it sets one)."""
        prepaid_left = state.granted - state.spent
        if not allowance.known:
            return cls(allowance, state.period_start_ms, state.used, None, None, prepaid_left,
                       None)
        used, start_ms = state.used, state.period_start_ms
        if allowance.period:
            bounds = periods.bounds_at(allowance.period,
                                       periods.now_ms() if now_ms is None else now_ms)
            # (a state of the next period: this host's clock is behind Redis's, at the boundary)
            if start_ms not in (bounds.start_ms, bounds.next_ms):
                used, start_ms = 0, bounds.start_ms
        elif start_ms != 0:
            used, start_ms = 0, 0  # counted under a refilled allowance, given once since
        allowance_used = min(used, allowance.units)
        allowance_left = allowance.units - allowance_used
        return cls(allowance, start_ms, used, allowance_used, allowance_left, prepaid_left,
                   allowance_left + prepaid_left)

    @classmethod
    def of_account(cls, rules, ref, state, now_ms=None):
        """Return the figures of the account ``ref`` holding ``state``, its allowance found in
        ``rules`` (an AccountRules of the rules in force)."""
        return cls.of(state, Allowance.of_account(rules, ref), now_ms)

    @property
    def period_start(self):
        """Return the start of the period counted (an aware datetime, UTC), or None."""
        if not self.period_start_ms:
            return None
        return datetime.datetime.fromtimestamp(self.period_start_ms / 1000,
                                               datetime.timezone.utc)

    def allowance_used_in_words(self):
        """Return the allowance used for a list's cell: '6 of 6 a day', 'no allowance' or
        'unknown'."""
        allowance = self.allowance
        if not allowance.known:
            return "unknown"
        if not allowance.units:
            return "no allowance"
        return f"{self.allowance_used} of {allowance.units} {allowance.per_period()}"

    def json_fields(self):
        """Return the figures as the staff API and the usage endpoint name them."""
        allowance, start = self.allowance, self.period_start
        return {
            "allowance": allowance.units,
            "allowance_period": allowance.period or None,
            "allowance_rule": allowance.rule or None,
            "allowance_unknown": allowance.unknown or None,
            "allowance_used": self.allowance_used,
            "allowance_left": self.allowance_left,
            "allowance_period_start": start.isoformat(timespec="seconds") if start else None,
            "used_in_period": self.used_in_period,
            "prepaid_left": self.prepaid_left,
            "units_left": self.units_left,
        }
