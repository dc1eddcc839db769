"""``Dashboard``: the table-less model whose changelist in the admin is the metrics dashboard.

It gives the dashboard a place in the admin and the permissions to see the metrics and reset a
client's buckets (admin/dashboard/). ``ratelimit_app.models`` re-exports it.
"""

from django.db import models

__all__ = ["Dashboard"]


class Dashboard(models.Model):
    """No table: gives the staff dashboard a place in the admin and its permissions."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_dashboard", "Can view the rate-limit dashboard"),
            ("reset_buckets", "Can reset a client's buckets"),
        ]
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
