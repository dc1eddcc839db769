"""Where a model's admin pages are: under its group when a group app is installed
(``registration.py`` puts them there), else under ``ratelimit_app``.

The app's own links to another model's pages (the dashboard to a credit account, a change page
to its audit trail) ask ``admin_url_name`` rather than spelling ``admin:ratelimit_app_…``, so
they go straight to the page, not through the old address's redirect. It asks the admin
registry, so it is right whichever group apps the project installed.
"""

from django.apps import apps
from django.contrib import admin
from django.contrib.admin.exceptions import NotRegistered

from ..config.models import Rule

__all__ = ["GROUPS_PACKAGE", "admin_url_name", "placed_model", "simulator_url_name"]

# The group apps are the installed apps under this package (ratelimit_app/groups/).
GROUPS_PACKAGE = "ratelimit_app.groups"


def placed_model(model, site=admin.site):
    """Return the model whose admin pages show ``model``'s rows on ``site``: its group's proxy
    when a group app holds it, else ``model``."""
    try:
        model_admin = site.get_model_admin(model)
    except NotRegistered:
        return model
    return getattr(model_admin, "moved_to", model)


def admin_url_name(model, view, site=admin.site):
    """Return the URL name of ``view`` ("changelist", "change", "top_up"…) of ``model``'s admin
    where it is registered: ``"admin:ratelimit_billing_creditaccount_change"`` when the Billing
    group is installed, ``"admin:ratelimit_app_creditaccount_change"`` otherwise."""
    opts = placed_model(model, site)._meta
    return f"{site.name}:{opts.app_label}_{opts.model_name}_{view}"


def simulator_url_name(site=admin.site):
    """Return the URL name of the simulator: its own entry under Monitoring when that group is
    installed, else the page beside the rules ("Simulate a request")."""
    if apps.is_installed(f"{GROUPS_PACKAGE}.monitoring"):
        simulator = apps.get_model("ratelimit_monitoring", "Simulator")
        if site.is_registered(simulator):
            return f"{site.name}:ratelimit_monitoring_simulator_changelist"
    return admin_url_name(Rule, "simulate", site)
