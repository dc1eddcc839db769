"""ratelimit_app: hierarchical token-bucket quotas for Django and DRF, edited in the admin.

Public names: ``ratelimit_app.throttling.QuotaThrottle``, ``ratelimit_app.middleware.QuotaMiddleware``,
models ``Plan``, ``Rule`` and ``EndpointCost`` in ``ratelimit_app.models``, settings dict
``RATELIMIT_APP``.
"""
