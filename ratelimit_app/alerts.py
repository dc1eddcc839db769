"""Public path of the quota alerts' signal: ``ratelimit_app.alerts.quota_threshold_crossed``.

A receiver connected to it is called once per threshold crossing stored (docs/howto/alerts.md).
The alerts themselves live in ``business/alerts/``.
"""

from .business.alerts.crossings import quota_threshold_crossed

__all__ = ["quota_threshold_crossed"]
