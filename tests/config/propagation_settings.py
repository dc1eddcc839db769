"""tests.config.reload_settings with every limited response saying which config version decided it
and
in which worker (EXPOSE_CONFIG_VERSION), for the servers tests/config/test_propagation.py
starts. The Redis Cluster comes from REDIS_CLUSTER_NODES, as in project.settings."""

from tests.config.reload_settings import *  # noqa: F403
from tests.config.reload_settings import RATELIMIT_APP

RATELIMIT_APP = {**RATELIMIT_APP, "EXPOSE_CONFIG_VERSION": True}
