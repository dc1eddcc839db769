"""Session fixtures for real Redis topologies: a 3-master/3-replica Cluster and a Sentinel setup.

Registered in conftest.py through ``pytest_plugins``. Each starts only when a test first asks for
it and stops (by PID, temp dirs removed) at the end of the session, also after failures. A test
that kills a node must bring the topology back (``restart_node`` / ``ensure_healthy``) so later
tests in the session get a healthy one.
"""

import pytest

from ratelimit_app.testing import RedisCluster, SentinelSetup


@pytest.fixture(scope="session")
def redis_cluster(server_executable):
    """A real Redis Cluster on 127.0.0.1: 3 masters, 1 replica each, cluster-node-timeout 2 s."""
    cluster = RedisCluster(executable=server_executable).start()  # start() stops what it started if it fails
    try:
        yield cluster
    finally:
        cluster.stop()


# generous: a 2-core machine running 6 nodes and several workers may answer slowly; failure
# tests set their own
CLUSTER_OPTIONS = {"socket_timeout": 5, "socket_connect_timeout": 1}


@pytest.fixture
def cluster(redis_cluster, settings):
    """The session's cluster, healthy and empty, with the app's Limiter on it (CLUSTER_NODES,
    CLUSTER_OPTIONS)."""
    redis_cluster.ensure_healthy()
    redis_cluster.flushall()
    settings.RATELIMIT_APP = {**settings.RATELIMIT_APP,
                              "CLUSTER_NODES": [redis_cluster.nodes[0].address],
                              "CLUSTER_OPTIONS": CLUSTER_OPTIONS}
    return redis_cluster


@pytest.fixture(scope="session")
def redis_sentinel(server_executable):
    """A real Sentinel setup on 127.0.0.1: master, replica, three sentinels (quorum 2)
    watching ``mymaster`` with down-after 1 s and failover-timeout 2 s."""
    setup = SentinelSetup(executable=server_executable).start()
    try:
        yield setup
    finally:
        setup.stop()
