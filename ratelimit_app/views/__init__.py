"""The app's own HTTP endpoints, mounted by ``ratelimit_app.urls``: a caller's usage (``usage``),
the staff JSON APIs of usage records (``usage_records``) and prepaid credits (``credits``), and
the Prometheus metrics (``prometheus``).

Layer: beside the admin and the operations tools (none imports another); imports the runtime and
below.
"""
