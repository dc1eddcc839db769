"""ratelimit_app: hierarchical token-bucket quotas for Django and DRF, edited in the admin.

Public names: ``ratelimit_app.throttling.QuotaThrottle``, ``ratelimit_app.middleware.QuotaMiddleware``,
models ``Plan``, ``Rule`` and ``EndpointCost`` in ``ratelimit_app.models``, settings dict
``RATELIMIT_APP``; ``ratelimit_app.reload_config()`` makes every worker apply the quota rows now.
"""

# The one place the version is written: pyproject.toml reads it from here at build time
# (setuptools' `attr:`), and code or a checkout that is not pip-installed can read it too.
__version__ = "0.2.0"

__all__ = ["reload_config"]


def reload_config():
    """Make every worker reload the quota rows within about a second (this process at once).

    For rows changed without a signal (a queryset's ``update()``, ``bulk_create``, raw SQL),
    which workers otherwise apply within ``CONFIG_RELOAD_INTERVAL_S``; ``manage.py ratelimit
    reload`` does the same. Returns the new config version; raises
    ``ratelimit_app.stores.StoreUnavailable`` when Redis cannot be told.
    """
    from .runtime.limiter import (
        default_limiter,  # (not at import: the package is imported by settings)
    )

    return default_limiter().bump_config_version()
