"""The rows of usage records for billing: one per caller, rule and day, and the batches rolled up.

``ratelimit_app.models`` re-exports them (Django finds every model of the app there).
"""

from django.db import models

__all__ = ["UsageRecord", "RollupBatch"]


class UsageRecord(models.Model):
    """What one caller used under one rule on one day (in CALENDAR_TIME_ZONE), for billing.

    Written only by the rollup (rollup.py), never on the request path. ``identity`` is the
    caller's ref (``key:<id>``, ``user:<id>``, or ``anonymous`` for every anonymous caller of a
    tenant); ``rule`` is the rule's name when the usage was counted (records outlive rules).
    """

    day = models.DateField()
    identity = models.CharField(max_length=150)
    tenant = models.CharField(max_length=150, blank=True)
    rule = models.CharField(max_length=64)
    display = models.CharField(max_length=200, blank=True,
                               help_text="How staff know the caller (never a secret).")
    units = models.BigIntegerField(default=0, help_text="Units the rule's bucket charged.")
    allowed = models.BigIntegerField(default=0, help_text="Requests allowed.")
    refused = models.BigIntegerField(default=0, help_text="Requests refused (charged nothing).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "identity", "tenant", "rule"],
                                               name="ratelimit_usage_record_unique")]
        indexes = [models.Index(fields=["tenant", "day"], name="ratelimit_usage_tenant_day")]
        ordering = ["day", "tenant", "identity", "rule"]
        default_permissions = ("view",)

    def __str__(self):
        return f"{self.day} {self.identity} {self.rule}: {self.units} units"


class RollupBatch(models.Model):
    """A claimed batch of usage counts that was added to the UsageRecords: a rollup that finds
    its batch here already (it crashed after the commit, before deleting the claimed counts in
    Redis) deletes them without adding them twice."""

    batch_id = models.CharField(max_length=64, unique=True)
    rolled_up_at = models.DateTimeField(auto_now_add=True)
    records = models.PositiveIntegerField(default=0, help_text="Records added to or created.")

    class Meta:
        default_permissions = ()

    def __str__(self):
        return self.batch_id
