"""The optional apps that group the admin index by task (``ratelimit_app/groups/``), and which
of them a project has installed: read by the system check ``ratelimit_app.W007``. The app's own
section keeps its name, "Rate limits" (the quotas), and sorts before the groups'
("Rate limits · Alerts"…).

Names, not imports: the group apps sit above every other layer of the package.
"""

from django.apps import apps

__all__ = ["GROUP_APPS", "missing_group_apps"]

# In the order INSTALLED_APPS lists them in the docs (docs/howto/install.md).
GROUP_APPS = (
    "ratelimit_app.groups.callers",
    "ratelimit_app.groups.billing",
    "ratelimit_app.groups.alerts",
    "ratelimit_app.groups.monitoring",
    "ratelimit_app.groups.protection",
)


def missing_group_apps():
    """Return the group apps not in INSTALLED_APPS, in ``GROUP_APPS``' order."""
    return [name for name in GROUP_APPS if not apps.is_installed(name)]
