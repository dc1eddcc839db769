"""The demo's environment contract (issue 10 §4): project/settings.py reads REDIS_URL,
REDIS_CLUSTER_NODES, or REDIS_SENTINELS with REDIS_SENTINEL_SERVICE.

Each case imports the settings in a fresh interpreter with exactly that environment, as
``make run`` would, and reports what it built.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ("REDIS_URL", "REDIS_CLUSTER_NODES", "REDIS_SENTINELS", "REDIS_SENTINEL_SERVICE")

# Prints the cache and cluster settings, and the ids of check_settings' findings.
REPORT = """
import json
import django
django.setup()
from django.conf import settings
from ratelimit_app.operations.system_checks import check_settings
print(json.dumps({"caches": settings.CACHES,
                  "cluster_nodes": settings.RATELIMIT_APP.get("CLUSTER_NODES", []),
                  "findings": [finding.id for finding in check_settings()]}))
"""


def settings_under(**variables):
    """Run REPORT with only ``variables`` of the contract set; return the CompletedProcess."""
    env = {key: value for key, value in os.environ.items() if key not in CONTRACT}
    env.update(variables, DJANGO_SETTINGS_MODULE="project.settings")
    return subprocess.run([sys.executable, "-c", REPORT], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def report_under(**variables):
    done = settings_under(**variables)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_redis_url_is_one_node_through_django_redis():
    report = report_under(REDIS_URL="redis://127.0.0.1:6390/2")
    cache = report["caches"]["default"]
    assert cache["BACKEND"] == "django_redis.cache.RedisCache"
    assert cache["LOCATION"] == "redis://127.0.0.1:6390/2"
    assert "CLIENT_CLASS" not in cache["OPTIONS"]
    assert report["cluster_nodes"] == [] and report["findings"] == []


def test_nothing_set_is_the_local_default_node():
    cache = report_under()["caches"]["default"]
    assert cache["LOCATION"] == "redis://127.0.0.1:6379/0"


def test_cluster_nodes_go_to_the_app_and_django_gets_a_local_cache():
    report = report_under(REDIS_CLUSTER_NODES="127.0.0.1:7001, 127.0.0.1:7002,10.0.0.5:7003",
                          REDIS_URL="redis://127.0.0.1:6390/0")  # the cluster wins
    assert report["cluster_nodes"] == ["127.0.0.1:7001", "127.0.0.1:7002", "10.0.0.5:7003"]
    assert report["caches"]["default"]["BACKEND"] == \
        "django.core.cache.backends.locmem.LocMemCache"
    assert "ratelimit_app.E001" not in report["findings"]  # no django-redis cache needed


def test_sentinels_configure_the_sentinel_client_with_its_connection_factory():
    report = report_under(REDIS_SENTINELS="127.0.0.1:26379,127.0.0.1:26380",
                          REDIS_SENTINEL_SERVICE="orders")
    cache = report["caches"]["default"]
    assert cache["LOCATION"] == "redis://orders/0"
    assert cache["OPTIONS"]["CLIENT_CLASS"] == "django_redis.client.SentinelClient"
    assert cache["OPTIONS"]["CONNECTION_FACTORY"] == "django_redis.pool.SentinelConnectionFactory"
    assert cache["OPTIONS"]["SENTINELS"] == [["127.0.0.1", 26379], ["127.0.0.1", 26380]]
    assert cache["OPTIONS"]["SOCKET_TIMEOUT"] == 0.25
    assert report["cluster_nodes"] == [] and report["findings"] == []


def test_sentinel_service_defaults_to_mymaster():
    cache = report_under(REDIS_SENTINELS="127.0.0.1:26379")["caches"]["default"]
    assert cache["LOCATION"] == "redis://mymaster/0"


def test_malformed_or_conflicting_values_stop_startup_with_the_variable_named():
    done = settings_under(REDIS_SENTINELS="127.0.0.1")
    assert done.returncode != 0 and "REDIS_SENTINELS: '127.0.0.1' is not host:port" in done.stderr
    done = settings_under(REDIS_SENTINELS="127.0.0.1:26379", REDIS_CLUSTER_NODES="127.0.0.1:7001")
    assert done.returncode != 0 and "not both" in done.stderr


def test_every_docs_page_the_settings_cite_exists():
    """A comment pointing at a missing page sends a reader nowhere (it once cited
    docs/sentinel-notes.md, which never existed)."""
    settings_source = (PROJECT_ROOT / "project" / "settings.py").read_text()
    cited = re.findall(r"\bdocs/[\w/.-]+\.md\b", settings_source)
    assert cited, "the settings no longer cite their docs page"
    assert [path for path in cited if not (PROJECT_ROOT / path).is_file()] == []
