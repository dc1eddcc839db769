"""The rows of prepaid credits: one account per API key, user or tenant, and its top-ups.

``ratelimit_app.models`` re-exports them (Django finds every model of the app there). The
balance itself lives in Redis, where the request path debits it (decision/balances.py); the
account row is the ledger's side: the sum of the top-ups (``granted``, raised in the same
transaction as each top-up) and the last checkpoint of Redis's state, which the balance is
rebuilt from when Redis loses it (ledger.py).
"""

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

__all__ = ["CreditAccount", "CreditTopUp", "MAX_TOP_UP_UNITS"]

# The most one top-up may credit: well inside what take.lua's numbers (Lua doubles, exact to
# 2^53) hold, however many top-ups add up.
MAX_TOP_UP_UNITS = 10**12


class CreditAccount(models.Model):
    """The prepaid balance of one account (``key:12``, ``user:5``, ``tenant:acme``).

    Created by its first top-up or by the request path's first use of it (ledger.seed). Never
    edited by hand: ``granted`` changes only with a top-up, the checkpoint fields only by
    ``manage.py ratelimit rollup`` (ledger.checkpoint).
    """

    ref = models.CharField(
        "account", max_length=160, unique=True,
        help_text="key:ID (an API key), user:ID (a user) or tenant:NAME.")
    display = models.CharField(max_length=200, blank=True,
                               help_text="How staff know the account (never a secret).")
    granted = models.BigIntegerField(
        default=0, help_text="Units of every top-up so far (raised in the top-up's transaction).")
    spent = models.BigIntegerField(
        default=0, help_text="Prepaid units consumed, as of the last checkpoint.")
    used = models.BigIntegerField(
        "consumed in the period", default=0,
        help_text="Units consumed in the allowance's period, as of the last checkpoint: the "
                  "allowance first, then prepaid units (the allowance used is at most the "
                  "allowance).")
    period_start_ms = models.BigIntegerField(
        "allowance period start (ms)", default=0,
        help_text="When that period started (ms since the epoch; 0: an allowance given once).")
    seq = models.BigIntegerField(
        "sequence", default=0,
        help_text="Redis's write counter of the balance at the last checkpoint: a Redis that "
                  "holds less lost writes, and is given this state back.")
    checkpointed_at = models.DateTimeField(null=True, blank=True,
                                           help_text="When Redis's state was last copied here.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["ref"]
        verbose_name = "credit account"
        # rows made by top-ups and the request path, never added, changed or deleted by hand
        default_permissions = ("view",)

    def __str__(self):
        return f"{self.ref} ({self.display})" if self.display else self.ref


class CreditTopUp(models.Model):
    """Units credited to an account, once: ``top_up_id`` (the caller's idempotency key) is
    unique, so a retried top-up finds its row and credits nothing again. Never changed or
    deleted: the account's ``granted`` is the sum of these rows."""

    account = models.ForeignKey(CreditAccount, on_delete=models.PROTECT, related_name="top_ups")
    top_up_id = models.CharField(
        "top-up id", max_length=100, unique=True,
        help_text="The caller's idempotency key: a top-up sent again with it credits nothing "
                  "again.")
    units = models.BigIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_TOP_UP_UNITS)])
    created = models.DateTimeField(auto_now_add=True)
    actor = models.CharField(max_length=150,
                             help_text="Who: a staff user name or a command.")
    note = models.CharField(max_length=500, blank=True,
                            help_text="Why (an invoice, an order, a goodwill credit).")

    class Meta:
        ordering = ["-created", "-id"]
        verbose_name = "credit top-up"
        # a ledger: rows are added, never changed or deleted
        default_permissions = ("add", "view")
        constraints = [models.CheckConstraint(condition=models.Q(units__gt=0),
                                              name="ratelimit_credit_top_up_positive")]

    def __str__(self):
        return f"{self.top_up_id}: {self.units} units to {self.account.ref}"
