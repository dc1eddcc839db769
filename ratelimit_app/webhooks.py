"""Public path of the webhook signature check: ``ratelimit_app.webhooks.verify_signature``.

A receiver of the quota alerts' webhooks may check each delivery with it, or with the
``standardwebhooks`` package (docs/howto/receive-webhooks.md). The deliveries themselves live in
``business/alerts/webhooks.py``, the signatures in ``business/alerts/signing.py``.
"""

from .business.alerts.signing import SIGNATURE_HEADER, verify_signature

__all__ = ["SIGNATURE_HEADER", "verify_signature"]
