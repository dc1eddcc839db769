"""A prepaid credit balance as Redis holds it, shared by the request path (``stores/lua/take.lua``,
``settle.lua``, ``refund.lua``) and the ledger's side (``business/credits``).

A balance belongs to an *account*: one API key, signed-in user or tenant, named by its
``account_ref`` (``key:12``, ``user:5``, ``tenant:acme``). Its Redis key sits beside the
identity's bucket key, in the same ``{tag}`` (so in the same Cluster slot and the same atomic
call as the other buckets), and never expires: it is money, not a cache.

Its value is five little-endian int64 (``BalanceState``):

- ``granted``: every top-up credited so far (the ledger's total, only ever raised);
- ``spent``: the prepaid units consumed so far (raised by debits, lowered by refunds);
- ``used``: the units consumed in the period starting at ``period_start_ms``, from the rule's
  allowance first and, past it, from the prepaid units (so ``spent`` grew by the part of
  ``used`` above the allowance); a never-refilled balance has one period, starting at 0;
- ``period_start_ms``: the start of that period;
- ``seq``: raised by every write, so the ledger's checkpoint can tell a Redis that lost writes
  (its ``seq`` below the checkpoint's) from one that moved on.

Units left: ``max(0, allowance - used) + granted - spent`` (below 0 only in debt, after a
metered request consumed more than was left).
"""

import struct
from typing import NamedTuple

from .keys import bucket_key, scope_token
from .scopes import Scope

__all__ = [
    "CREDIT_SCOPES",
    "NEVER_MS",
    "BalanceState",
    "account_key",
    "account_ref",
    "balance_key",
]

_VALUE = struct.Struct("<qqqqq")

# The scopes a balance may belong to: a caller (API key or signed-in user), or a tenant.
CREDIT_SCOPES = (Scope.USER, Scope.TENANT)

# The "next period" of a never-refilled balance: a moment no clock reaches (2^52 ms).
NEVER_MS = 2**52


class BalanceState(NamedTuple):
    """The five numbers of a balance's Redis value (see the module's docstring)."""

    granted: int = 0
    spent: int = 0
    used: int = 0
    period_start_ms: int = 0
    seq: int = 0

    def pack(self):
        """Return the value as take.lua reads it."""
        return _VALUE.pack(*self)

    @classmethod
    def unpack(cls, value):
        """Return the state of a stored value, or None if ``value`` is missing or not a
        balance's."""
        if not value or len(value) != _VALUE.size:
            return None
        return cls(*_VALUE.unpack(value))


def balance_key(identity_key):
    """Return the key of the balance beside an identity's bucket key (same ``{tag}``)."""
    return f"{identity_key}:credits"


def account_key(prefix, ref):
    """Return the balance key of the account ``ref`` (``key:12``): the one the request path
    charges for that caller."""
    kind, _, value = ref.partition(":")
    return balance_key(bucket_key(prefix, scope_token(kind, value)))


def account_ref(scope, identity):
    """Return the account a rule of ``scope`` charges for ``identity`` (``key:12``, ``user:5``,
    ``tenant:acme``), or None when the caller has none at that scope (anonymous, no tenant)."""
    if scope == Scope.USER:
        if identity.kind == "key":
            return f"key:{identity.api_key_id}"
        if identity.kind == "user":
            return f"user:{identity.user_id}"
        return None
    if scope == Scope.TENANT and identity.tenant:
        return f"tenant:{identity.tenant}"
    return None
