"""Quota alerts: threshold crossings learnt from decisions (``crossings``), stored once as rows
(``models``), and sent as signed webhooks from an outbox (``webhooks``): signed by Standard
Webhooks (``signing``), each POST within one deadline (``transport``), to the addresses allowed
(``destinations``).

The public paths ``ratelimit_app.alerts.quota_threshold_crossed`` and
``ratelimit_app.webhooks.verify_signature`` re-export from here.
"""
