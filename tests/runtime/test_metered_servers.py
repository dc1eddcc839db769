"""Metered costs with real servers: gunicorn (3 sync workers) and uvicorn (2 workers, async
views on the event loop) on the suite's redis-server and on the 3-master Cluster, serving
tests/runtime/metered_site.py. Concurrent callers report what their requests consumed; the
bucket in Redis is read afterwards: it holds exactly what the requests the servers allowed
reported, it never goes below its debt bound, and a stream its client abandoned is charged
what it produced."""

import concurrent.futures
import os
import random
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from ratelimit_app.decision.buckets import read_state
from ratelimit_app.decision.keys import bucket_key

from ..asgi_server import Gunicorn, Uvicorn, get
from ..helpers import poll_until
from ..config.test_reload_live import stop_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ESTIMATE, MINIMUM = 10, 1
PERIOD_MS = 3_600_000  # 1 token an hour: no refill worth a token during a test
CHUNK_UNITS = 5        # metered_site.CHUNK_UNITS

# A global rule of argv[1] tokens with argv[2] of debt allowed, and the metered endpoints.
SETUP = f"""
import sys
import django
django.setup()
from ratelimit_app.models import EndpointCost, Plan, Rule
burst, debt = int(sys.argv[1]), int(sys.argv[2])
Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
rule = Rule(name="units", scope="global", rate=1, period_s=3600, burst=burst, debt=debt)
rule.full_clean()
rule.save()
for endpoint in ("units", "aunits", "stream", "astream"):
    EndpointCost.objects.create(endpoint=endpoint, cost={ESTIMATE}, metered=True,
                                minimum={MINIMUM})
print(rule.id)
"""

# each server's view and stream: uvicorn's async (Django would read a sync stream whole first)
GLOBAL_KEY = bucket_key("rl", "global")  # the key of every global rule's bucket

SERVERS = {"gunicorn": (Gunicorn, 3, "/units/", "/stream/"),
           "uvicorn": (Uvicorn, 2, "/aunits/", "/astream/")}


class Site:
    """A server of metered_site on a store; ``level()`` reads the global bucket in Redis."""

    def __init__(self, server, store_client, rule_id, notes):
        self.server, self.store_client, self.rule_id, self.notes = \
            server, store_client, rule_id, notes

    def level(self):
        """The bucket's tokens, as stored (below 0 in debt); None while no key holds it (full)."""
        state = read_state(self.store_client.get(GLOBAL_KEY), self.rule_id)
        return None if state is None else state[0] // PERIOD_MS


def start_site(kind, store, request, tmp_path, redis_server, database_env, burst, debt):
    server_class, workers = SERVERS[kind][:2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.runtime.metered_site",
           **database_env(tmp_path), "REDIS_URL": redis_server.url,
           "NOTES_REDIS_URL": redis_server.url, "DJANGO_DEBUG": "0"}
    if store == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        cluster.ensure_healthy()
        cluster.flushall()
        env["REDIS_CLUSTER_NODES"] = cluster.nodes_env
        store_client = cluster.client()
    else:
        store_client = redis_server.client()
    rule_id = int(python(["-c", SETUP, str(burst), str(debt)], env, migrate=True))
    server = server_class(env, tmp_path, workers=workers).start()
    request.addfinalizer(lambda: stop_server(server))
    return Site(server, store_client, rule_id, redis_server.client())


def python(args, env, migrate=False):
    if migrate:
        python(["manage.py", "migrate", "--verbosity", "0"], env)
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


DEPLOYMENTS = [("gunicorn", "redis"), ("gunicorn", "cluster"), ("uvicorn", "redis"),
               ("uvicorn", "cluster")]
DEPLOYMENT_IDS = ["-".join(deployment) for deployment in DEPLOYMENTS]


@pytest.mark.parametrize("kind, store", DEPLOYMENTS, ids=DEPLOYMENT_IDS)
def test_the_bucket_holds_exactly_what_the_allowed_requests_reported(kind, store, request,
                                                                      tmp_path, redis_server,
                                                                      database_env):
    # a debt bound no settle reaches: every unit reported is charged, none lost to a bound
    burst = 2_000
    site = start_site(kind, store, request, tmp_path, redis_server, database_env, burst,
                      debt=100_000)
    path = SERVERS[kind][2]
    reports = [random.Random(seed).choice([0, 3, ESTIMATE, 25, 60]) for seed in range(240)]

    def call(units):
        return units, get(site.server, f"{path}?n={units}").status

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, reports))
    assert {status for _, status in answers} <= {200, 429}, answers
    allowed = [units for units, status in answers if status == 200]
    charged = sum(max(units, MINIMUM) for units in allowed)
    assert charged > burst  # the bucket ran dry: refusals and debts both happened
    assert any(status == 429 for _, status in answers)
    # a settle runs once the response is finished, after the client has it: wait for the last
    poll_until(lambda: site.level() == burst - charged, 10,
               f"the bucket at {burst} - {charged} (it holds {site.level()})")


@pytest.mark.parametrize("kind, store", DEPLOYMENTS, ids=DEPLOYMENT_IDS)
def test_concurrent_callers_never_take_a_bucket_below_its_debt_bound(kind, store, request,
                                                                     tmp_path, redis_server,
                                                                     database_env):
    burst, debt = 200, 40
    site = start_site(kind, store, request, tmp_path, redis_server, database_env, burst, debt)
    path = SERVERS[kind][2]
    levels = []

    def call(_):
        status = get(site.server, f"{path}?n=90").status  # 80 more than admitted for
        levels.append(site.level())
        return status

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(call, range(60)))
    assert set(statuses) <= {200, 429} and 429 in statuses
    poll_until(lambda: site.level() == -debt, 10, f"the bucket at its bound -{debt}")
    assert min(level for level in levels if level is not None) >= -debt


@pytest.mark.parametrize("kind", SERVERS)
def test_a_stream_its_client_abandons_is_charged_what_it_produced(kind, request, tmp_path,
                                                                  redis_server, database_env):
    burst = 10**6
    site = start_site(kind, "redis", request, tmp_path, redis_server, database_env, burst,
                      debt=0)
    name = uuid.uuid4().hex
    with socket.create_connection(("127.0.0.1", site.server.port), timeout=10) as client:
        client.sendall(f"GET {SERVERS[kind][3]}?id={name} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        received = 0
        while received < 200_000:  # a few chunks, then the client is gone
            received += len(client.recv(65_536))
    poll_until(lambda: site.notes.get(f"closed:{name}") is not None, 15,
               "the server to close the abandoned stream")
    produced = int(site.notes.get(f"produced:{name}"))
    assert CHUNK_UNITS * 3 <= produced < CHUNK_UNITS * 10_000  # abandoned early
    poll_until(lambda: site.level() == burst - produced, 10,
               f"the bucket charged the {produced} units produced (it holds {site.level()})")
