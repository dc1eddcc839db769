"""Optional apps that group the app's admin index by task: Callers, Billing, Alerts, Monitoring,
Protection.

Django's admin index makes one section per app label, so a section of its own needs an app of
its own. Each app here holds PROXY models of ``ratelimit_app``'s models (``proxy=True``: no
table, the rows stay where they are, in ``ratelimit_app``'s tables and migrations) and the
admin registers the model's admin on the proxy (``admin/placement.py``). ``ratelimit_app``
keeps the quotas (plans, rules, endpoint costs). Installed after ``"ratelimit_app"``::

    INSTALLED_APPS = [..., "ratelimit_app",
                      "ratelimit_app.groups.callers", "ratelimit_app.groups.billing",
                      "ratelimit_app.groups.alerts", "ratelimit_app.groups.monitoring",
                      "ratelimit_app.groups.protection"]

Without them every page is under one section, "Rate limits", with no warning: the grouping is
optional.
Layer: the top one; it imports ``ratelimit_app.models`` and nothing imports it (the admin finds
the proxies in Django's app registry).
"""

from django.apps import AppConfig

__all__ = ["GroupConfig", "proxy_meta"]


class GroupConfig(AppConfig):
    """The AppConfig of a group: its label names the admin's URLs (``/admin/<label>/…``), its
    verbose name the index section ("Rate limits · Billing"). Every group's name starts with
    "Rate limits · " so the six sections sort together in the index and the sidebar."""

    default_auto_field = "django.db.models.BigAutoField"


def proxy_meta(concrete):
    """Return the ``Meta`` of a group's proxy of ``concrete``: its names, and no permissions of
    its own (the admin asks ``concrete``'s, so the staff's grants keep working and nobody is
    tempted to grant a permission that would do nothing)."""
    return type("Meta", (), {
        "proxy": True,
        "verbose_name": concrete._meta.verbose_name,
        "verbose_name_plural": concrete._meta.verbose_name_plural,
        "default_permissions": (),
    })
