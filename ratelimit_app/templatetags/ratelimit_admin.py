"""Template tags of the app's own admin pages (dashboard, caller pages, simulator, new API key)."""

import django
from django import template
from django.urls import reverse

from ..admin.index_tasks import by_task, dashboard_first
from ..admin.placement import simulator_url_name

register = template.Library()

# The markup the running admin's stylesheet styles: Django 6.1 made breadcrumbs an ordered list
# (<ol class="breadcrumbs"> of <li>, the separators drawn by CSS); up to 6.0 they are a
# <div class="breadcrumbs"> of links with "›" between them. Each stylesheet styles only its own.
BREADCRUMBS_AS_LIST = django.VERSION >= (6, 1)


@register.inclusion_tag("ratelimit_app/admin_breadcrumbs.html")
def admin_breadcrumbs(opts, current=""):
    """Return the context of the breadcrumbs Home › app › ``opts``'s list › ``current``.

    Without ``current`` the model's list is the page itself (the dashboard). Rendered in the
    markup of the running Django version, as the admin's own change form renders them.
    """
    return {"opts": opts, "current": current, "as_list": BREADCRUMBS_AS_LIST}


@register.simple_tag
def simulator_url():
    """Return the simulator's URL: its entry under Monitoring when that group app is installed,
    else the page beside the rules (``admin/placement.py``)."""
    return reverse(simulator_url_name())


@register.inclusion_tag("ratelimit_app/admin_dashboard_first.html")
def dashboard_lead(app_list, by_tasks=False):
    """Render an index's app list with the dashboard first, on a line of its own
    (``admin/index_tasks.py``): the admin's index, or with ``by_tasks`` the app's own index
    page (one table per task)."""
    dashboard, rest = dashboard_first(app_list)
    return {"dashboard": dashboard, "app_list": by_task(rest) if by_tasks else rest}
