"""Proxies of the dashboard and the audit trail, and the simulator's table-less model."""

from django.db import models as db

from ratelimit_app import models

from .. import proxy_meta


class Dashboard(models.Dashboard):
    Meta = proxy_meta(models.Dashboard)


class AuditEntry(models.AuditEntry):
    Meta = proxy_meta(models.AuditEntry)


class Simulator(db.Model):
    """No table: gives the simulator an entry of its own in the index. Who may see it is who
    may view the rules (``ratelimit_app.view_rule``), as on the rules' list."""

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = "simulator"
        verbose_name_plural = "simulator"
