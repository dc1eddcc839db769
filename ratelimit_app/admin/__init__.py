"""The Django admin: the model admins and forms, the simulator, and the staff dashboard.

Django imports this package when it discovers the admin modules of installed apps; importing it
registers every model admin (``registration.py``: on the app's model, or on its group's proxy when
the group apps of ``ratelimit_app/groups/`` are installed). Layer: imports the runtime (the
process's Limiter) and the layers below it; never the views or the operations tools, and
nothing on the request path imports it.

- ``config.py``: plans, rules, endpoint costs, API keys, overrides, and the simulator's page
  (``simulator.py``; its own index entry: ``simulator_admin.py``), with the operator-worded
  forms of ``forms.py``, ``rule_forms.py`` and ``override_forms.py`` ("× 2 for 7 days").
- ``audit.py``: the audit trail and its restore; ``alerts.py``: alerts, webhooks, deliveries;
  ``usage.py``: the usage records page; ``credits.py``: prepaid credit accounts (with their
  "Top up" form) and top-ups; ``readonly.py``: the view-only admin they share.
- ``dashboard/``: hot keys, 429 rates; ``callers/``: a page per caller.
- ``registration.py``: where each admin is registered; ``placement.py``: ``admin_url_name``,
  where a model's pages are (for links to them).
"""

from django.contrib import admin

from .registration import register_admins

register_admins(admin.site)
# The index leads with the dashboard (admin/index_tasks.py), unless the project chose its own
# index template; the template extends the project's admin/index.html when it has one.
if admin.site.index_template is None:
    admin.site.index_template = "ratelimit_app/admin_index.html"
