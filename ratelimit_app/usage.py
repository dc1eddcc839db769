"""Public path of the usage endpoint's view: ``ratelimit_app.usage.usage_view``.

A project that mounts the view itself, rather than through ``ratelimit_app.urls``, imports it from
here (docs/reference/usage.md). The view lives in ``views/usage.py``.
"""

from .views.usage import usage_view

__all__ = ["usage_view"]
