"""Where the metrics reach Redis unless they are told otherwise: the process's default Limiter.

The only module of the package that knows the request path exists. A Limiter that owns its own
recorder and flusher passes its store's client and its error count instead.
"""

__all__ = ["app_client", "app_request_errors"]


def app_client():
    """Return the redis-py client of the default Limiter's store (the metrics' only way in)."""
    from ..limiter import default_limiter  # here: the Limiter will import the metrics

    return default_limiter().store.metrics_client()


def app_request_errors():
    """Return how many Redis errors the default Limiter's decisions met in this process."""
    from ..limiter import default_limiter

    return default_limiter().stats.redis_errors
