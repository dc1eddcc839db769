"""tests.adapters.ninja_settings with drf-spectacular (the rate-limit hook, Swagger UI's files
from drf-spectacular-sidecar) and Ninja's own static files (its /docs page's Swagger UI), every
file served by the server itself: the browser test runs with no network."""

from tests.adapters.ninja_settings import *  # noqa: F403
from tests.adapters.ninja_settings import INSTALLED_APPS, REST_FRAMEWORK
from project.settings import RATELIMIT_APP

INSTALLED_APPS = [*INSTALLED_APPS, "ninja", "drf_spectacular", "drf_spectacular_sidecar"]
ROOT_URLCONF = "tests.openapi.urls"
REST_FRAMEWORK = {**REST_FRAMEWORK,
                  "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
SPECTACULAR_SETTINGS = {
    "TITLE": "Demo API",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "ratelimit_app.openapi.spectacular.add_rate_limits"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"showExtensions": True},  # the x-ratelimit-cost field
}
# every plan's cost shown (the default names the default plans only)
RATELIMIT_APP = {**RATELIMIT_APP, "OPENAPI_PLANS": "all"}
