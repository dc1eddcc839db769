"""Which credits rule charges an account: for its allowance (figures.py) and its alerts
(alerts.py).

An account's balance is charged by the credits rules of its scope (``key:``/``user:`` accounts
by those of scope user, ``tenant:`` accounts by those of scope tenant), one per plan: two
credits rules of one scope never apply to the same plan (``Rule._clean_credits``). So:

- a rule of the scope for every plan is the one;
- else, for an API key or a user, the rule of the caller's plan, found as the request path
  finds it (the key's own plan, else its user's assignment's, else the default for signed-in
  callers);
- else, where the plan cannot be known without a request (a tenant's callers may be on
  several plans; a ``PLAN_RESOLVER`` needs the request), the only rule of the scope if there
  is one rule only; with several, none is named: the allowance depends on the caller's plan.

Nothing is guessed: where no rule can be named, ``find`` says why.
"""

from ...conf import get_config
from ...decision.identity import plan_of
from ...decision.scopes import Scope

__all__ = ["AccountRules"]

# the accounts of a credits rule's scope, in words
_ACCOUNTS_OF = {Scope.USER: "API keys and users", Scope.TENANT: "tenants"}


class AccountRules:
    """The credits rules of a policy snapshot (the rules in force), and which one charges an
    account. Built once per page or checkpoint: finding an API key's plan indexes the keys
    once."""

    def __init__(self, snapshot):
        """``snapshot``: the policy in force, or None when it cannot be had now (no rule is
        then named)."""
        self.snapshot = snapshot
        self.rules = [r for r in snapshot.rules if r.credits] if snapshot is not None else []
        self.alerting = any(r.alerts for r in self.rules)
        self._keys = None  # API key id -> ApiKeyEntry, built on first need

    def rule_for(self, ref):
        """Return the CompiledRule that charges the account ``ref``, or None."""
        return self.find(ref)[0]

    def find(self, ref):
        """Return ``(rule, "")`` for the CompiledRule that charges the account ``ref``
        (``key:12``, ``user:5``, ``tenant:acme``), or ``(None, why)``: a sentence saying why
        no rule can be named."""
        if self.snapshot is None:
            return None, "the rules in force cannot be read now"
        kind, _, value = ref.partition(":")
        scope = Scope.TENANT if kind == "tenant" else Scope.USER
        rules = [r for r in self.rules if r.scope == scope]
        if not rules:
            return None, f"no credits rule for {_ACCOUNTS_OF[scope]} is in force"
        for_every_plan = [r for r in rules if r.plan is None]
        if for_every_plan:
            return for_every_plan[0], ""
        if kind != "tenant" and not get_config()["PLAN_RESOLVER"]:
            known, plan = self._plan(kind, value)
            if not known:
                return None, "its API key is revoked or deleted: no rule charges it now"
            for rule in rules:
                if rule.plan == plan:
                    return rule, ""
            return None, (f"no credits rule applies to its plan “{plan}”" if plan else
                          "it is on no plan, and no credits rule applies to every plan")
        if len(rules) == 1:
            return rules[0], ""
        names = ", ".join(f"“{r.name}”" for r in rules)
        why = "a tenant's callers may be on several plans" if kind == "tenant" else \
            "its plan comes from PLAN_RESOLVER, which needs a request"
        return None, f"{why}, and the credits rules {names} apply to different plans"

    def _plan(self, kind, value):
        """Return ``(True, plan slug or None)`` for a key or user account; ``(False, None)``
        for an API key that is no longer in force."""
        snapshot = self.snapshot
        if kind == "key":
            if self._keys is None:
                self._keys = {entry.id: entry for entry in snapshot.api_keys.values()}
            key = self._keys.get(int(value))
            if key is None:
                return False, None
            return True, plan_of(key, snapshot.assignments.get(key.user_id), snapshot)
        return True, plan_of(None, snapshot.assignments.get(value), snapshot)
