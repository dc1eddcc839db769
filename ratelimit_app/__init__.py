"""ratelimit_app: hierarchical token-bucket quotas for Django and DRF, edited in the admin.

Public names: ``ratelimit_app.throttling.QuotaThrottle``, ``ratelimit_app.middleware.QuotaMiddleware``,
models ``Plan``, ``Rule`` and ``EndpointCost`` in ``ratelimit_app.models``, settings dict
``RATELIMIT_APP``.
"""

# The one place the version is written: pyproject.toml reads it from here at build time
# (setuptools' `attr:`), and code or a checkout that is not pip-installed can read it too.
__version__ = "0.2.0"
