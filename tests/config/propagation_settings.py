"""tests.config.reload_settings with every limited response saying which config version decided it
and in which worker (EXPOSE_CONFIG_VERSION), and the app's log level from RATELIMIT_LOG_LEVEL,
for the servers tests/config/test_propagation.py starts. The Redis Cluster comes from REDIS_CLUSTER_NODES, as in project.settings."""

from tests.config.reload_settings import *  # noqa: F403
import os

from tests.config.reload_settings import LOGGING, RATELIMIT_APP

RATELIMIT_APP = {**RATELIMIT_APP, "EXPOSE_CONFIG_VERSION": True}

# INFO when a test reads the workers' log (each says when it starts watching)
LOGGING = {**LOGGING, "loggers": {"ratelimit_app": {
    "handlers": ["console"], "level": os.environ.get("RATELIMIT_LOG_LEVEL", "WARNING")}}}
