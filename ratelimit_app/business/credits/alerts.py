"""Alerts on prepaid credits: ``credits.low`` and ``credits.exhausted``.

A credits rule's ``alert_thresholds`` are percents of an account's **last top-up** used: with a
top-up of U units, p % is reached when the prepaid units left are at most U − ceil(U × p / 100)
(100 %: none left). The request path does not know U (Redis holds the totals only), so the
checkpoint (``ledger.checkpoint``, run by ``manage.py ratelimit rollup``) compares each account's
balance after it is checkpointed, and stores what it reached through the quota alerts' own
machinery (``store_crossings``: one QuotaAlert row, its webhooks, the signal): once per account,
threshold and top-up (the top-up's time is the alert's period start), however often the
checkpoint runs. An alert is therefore noticed within one rollup interval.

The rule charging an account is found by ``rules.AccountRules`` (as the request path finds
it); an account whose rule cannot be named, or whose rule has no thresholds, does not alert.
"""

from ...decision.balances import account_key
from ..alerts.crossings import Crossing

__all__ = ["credit_crossings"]


def credit_crossings(account, state, last_top_up, rule, prefix):
    """Return the Crossings of ``rule``'s thresholds that the account's balance ``state`` (a
    BalanceState) has reached against its ``last_top_up``; () without a top-up."""
    if last_top_up is None:
        return ()
    size = last_top_up.units
    used = size - (state.granted - state.spent)  # of the last top-up (more than it in debt)
    if used <= 0:
        return ()  # units of earlier top-ups are still left beyond it
    start_ms = int(last_top_up.created.timestamp() * 1000)
    display = f"{account.ref} ({account.display})" if account.display else account.ref
    return tuple(
        Crossing(rule.id, account_key(prefix, account.ref), display[:300], percent, start_ms,
                 used, size)
        for percent in rule.alerts if used >= -(size * percent // -100))
