"""The Django admin: the model admins and forms, the simulator, and the staff dashboard.

Django imports this package when it discovers the admin modules of installed apps; importing it
registers every model admin. Layer: imports the runtime (the process's Limiter) and the layers
below it; never the views or the operations tools, and nothing on the request path imports it.

- ``config.py``: plans, rules, endpoint costs, API keys, overrides, and the simulator's page
  (``simulator.py``), with the operator-worded forms of ``forms.py``.
- ``audit.py``: the audit trail and its restore; ``alerts.py``: alerts, webhooks, deliveries;
  ``usage.py``: the usage records page; ``credits.py``: prepaid credit accounts (with their
  "Top up" form) and top-ups; ``readonly.py``: the view-only admin they share.
- ``dashboard/``: hot keys, 429 rates, the bucket inspector.
"""

from . import alerts, audit, config, credits, usage  # noqa: F401  (each registers its model admins)
from .dashboard import admin as dashboard_admin  # noqa: F401  (registers the staff dashboard)
