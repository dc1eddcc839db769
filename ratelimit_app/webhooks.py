"""Public path of the webhook signature check: ``ratelimit_app.webhooks.verify_signature``.

A receiver of the quota alerts' webhooks checks each body with it (docs/howto/alerts.md). The
deliveries themselves live in ``business/alerts/webhooks.py``.
"""

from .business.alerts.webhooks import SIGNATURE_HEADER, verify_signature

__all__ = ["SIGNATURE_HEADER", "verify_signature"]
