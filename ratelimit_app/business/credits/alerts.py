"""Alerts on prepaid credits: ``credits.low`` and ``credits.exhausted``.

A credits rule's ``alert_thresholds`` are percents of an account's **last top-up** used: with a
top-up of U units, p % is reached when the prepaid units left are at most U − ceil(U × p / 100)
(100 %: none left). The request path does not know U (Redis holds the totals only), so the
checkpoint (``ledger.checkpoint``, run by ``manage.py ratelimit rollup``) compares each account's
balance after it is checkpointed, and stores what it reached through the quota alerts' own
machinery (``store_crossings``: one QuotaAlert row, its webhooks, the signal): once per account,
threshold and top-up (the top-up's time is the alert's period start), however often the
checkpoint runs. An alert is therefore noticed within one rollup interval.

The rule charging an account is found as the request path finds it: the account's plan (its API
key's, else its user's, else the default for signed-in callers; a PLAN_RESOLVER, which needs a
request, is not consulted) and the credits rule of the account's scope for that plan or for
every plan. A tenant's callers may be on several plans: only a tenant rule for every plan alerts.
"""

from ...decision.balances import account_key
from ...decision.identity import plan_of
from ...decision.scopes import Scope
from ..alerts.crossings import Crossing

__all__ = ["AccountRules", "credit_crossings"]


class AccountRules:
    """The credits rules with alert thresholds of a policy snapshot, and which one charges an
    account (built once per checkpoint)."""

    def __init__(self, snapshot):
        self.snapshot = snapshot
        self.rules = [r for r in snapshot.rules if r.credits and r.alerts]
        self._keys = None  # API key id -> ApiKeyEntry, built on first need

    def __bool__(self):
        return bool(self.rules)

    def rule_for(self, ref):
        """Return the CompiledRule with thresholds that charges the account ``ref``, or None."""
        kind, _, value = ref.partition(":")
        if kind == "tenant":
            scope, plan = Scope.TENANT, None
        else:
            scope = Scope.USER
            plan = self._plan(kind, value)
        for rule in self.rules:
            if rule.scope == scope and rule.plan in (None, plan):
                return rule
        return None

    def _plan(self, kind, value):
        snapshot = self.snapshot
        if kind == "key":
            if self._keys is None:
                self._keys = {entry.id: entry for entry in snapshot.api_keys.values()}
            key = self._keys.get(int(value))
            if key is None:
                return None  # revoked or deleted: it is charged nothing any more
            return plan_of(key, snapshot.assignments.get(key.user_id), snapshot)
        return plan_of(None, snapshot.assignments.get(value), snapshot)


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
