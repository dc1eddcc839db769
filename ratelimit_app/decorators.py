"""View decorators."""

__all__ = ["ratelimit_exempt"]


def ratelimit_exempt(view_func):
    """Mark a view as never limited by QuotaMiddleware (health checks, metrics scrapes)."""
    view_func.ratelimit_exempt = True
    return view_func
