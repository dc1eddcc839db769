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
import uuid

import pytest

from ratelimit_app.decision.buckets import read_state
from ratelimit_app.decision.keys import bucket_key

from ..asgi_server import Gunicorn, Uvicorn, get
from ..config.test_reload_live import python, stop_server
from ..helpers import poll_until, server_store

pytestmark = [pytest.mark.slow, pytest.mark.deployment, pytest.mark.database]

ESTIMATE, MINIMUM = 10, 1
PERIOD_MS = 3_600_000  # 1 token an hour: no refill worth a token during a test
CHUNK_UNITS = 5        # metered_site.CHUNK_UNITS

# A global rule and the metered endpoints; prints the rule's id.
SETUP = f"""
import django
django.setup()
from ratelimit_app.models import EndpointCost, Plan, Rule
Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
rule = Rule.objects.create(name="units", scope="global", rate=1, period_s=3600, burst=100)
for endpoint in ("units", "aunits", "stream", "astream"):
    EndpointCost.objects.create(endpoint=endpoint, cost={ESTIMATE}, metered=True,
                                minimum={MINIMUM})
print(rule.id)
"""

# The global rule's burst argv[1] and debt argv[2], saved (a new config version published).
CONFIGURE = """
import sys
import django
django.setup()
from ratelimit_app.models import Rule
rule = Rule.objects.get(name="units")
rule.burst, rule.debt = int(sys.argv[1]), int(sys.argv[2])
rule.full_clean()
rule.save()
"""

GLOBAL_KEY = bucket_key("rl", "global")  # the key of every global rule's bucket

# each server's view and stream: uvicorn's async (Django would read a sync stream whole first)
SERVERS = {"gunicorn": (Gunicorn, 3, "/units/", "/stream/"),
           "uvicorn": (Uvicorn, 2, "/aunits/", "/astream/")}


class Site:
    """A server of metered_site on a store; ``level()`` reads the global bucket in Redis."""

    def __init__(self, kind, server, env, store_client, rule_id, notes):
        self.kind, self.server, self.env = kind, server, env
        self.store_client, self.rule_id, self.notes = store_client, rule_id, notes

    @property
    def view(self):
        return SERVERS[self.kind][2]

    @property
    def stream(self):
        return SERVERS[self.kind][3]

    def configure(self, burst, debt):
        """Give the global rule ``burst`` and ``debt`` (every request after the save is decided
        on them: the fence) and a full bucket."""
        python(["-c", CONFIGURE, str(burst), str(debt)], self.env)
        self.store_client.delete(GLOBAL_KEY)

    def level(self):
        """The bucket's tokens, as stored (below 0 in debt); None while no key holds it (full)."""
        state = read_state(self.store_client.get(GLOBAL_KEY), self.rule_id)
        return None if state is None else state[0] // PERIOD_MS


DEPLOYMENTS = [("gunicorn", "redis"), ("gunicorn", "cluster"), ("uvicorn", "redis"),
               ("uvicorn", "cluster")]


@pytest.fixture(scope="module", params=DEPLOYMENTS, ids="-".join)
def site(request, tmp_path_factory, redis_server, database_env):
    """A server of the kind, on the store, ``request.param`` names (the suite's redis-server or
    the Cluster), on a migrated database of its own; returns a Site."""
    kind, store = request.param
    server_class, workers = SERVERS[kind][:2]
    workdir = tmp_path_factory.mktemp(f"metered-{kind}-{store}")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.runtime.metered_site",
           **database_env(workdir), "NOTES_REDIS_URL": redis_server.url, "DJANGO_DEBUG": "0"}
    store_client = server_store(request, store, env, redis_server)
    python(["manage.py", "migrate", "--verbosity", "0"], env)
    rule_id = int(python(["-c", SETUP], env))
    server = server_class(env, workdir, workers=workers).start()
    yield Site(kind, server, env, store_client, rule_id, redis_server.client())
    stop_server(server)


def test_the_bucket_holds_exactly_what_the_allowed_requests_reported(site):
    # a debt bound no settle reaches: every unit reported is charged, none lost to a bound
    burst = 2_000
    site.configure(burst, debt=100_000)
    path = site.view
    reports = [random.Random(seed).choice([0, 3, ESTIMATE, 25, 60]) for seed in range(240)]

    def call(units):
        return units, get(site.server, f"{path}?n={units}").status

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, reports))
    assert {status for _, status in answers} <= {200, 429}, answers
    allowed = [units for units, status in answers if status == 200]
    charged = sum(max(units, MINIMUM) for units in allowed)
    # the bucket ran dry: less than an estimate was left (and refusals happened)
    assert charged > burst - ESTIMATE
    assert any(status == 429 for _, status in answers)
    # a settle runs once the response is finished, after the client has it: wait for the last
    poll_until(lambda: site.level() == burst - charged, 10,
               f"the bucket at {burst} - {charged} (it holds {site.level()})")


def test_a_workers_first_request_is_settled_on_a_redis_that_lost_its_scripts(site):
    # first in the module: each server's workers have served nothing yet, so no metrics flush
    # runs (a metered request is counted once settled); the scripts are gone as after a
    # restart. The settle, sent without waiting, must still be applied (it was left waiting
    # for a NOSCRIPT reply nobody read when the worker's first request was metered).
    burst = 10**6
    site.configure(burst, debt=0)
    site.store_client.script_flush()
    assert get(site.server, f"{site.view}?n=25").status == 200
    poll_until(lambda: site.level() == burst - 25, 10,
               f"the request charged the 25 units it reported (the bucket holds {site.level()})")


def test_concurrent_callers_never_take_a_bucket_below_its_debt_bound(site):
    burst, debt = 200, 40
    site.configure(burst, debt)
    path = site.view
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


def test_a_stream_its_client_abandons_is_charged_what_it_produced(site):
    burst = 10**6
    site.configure(burst, debt=0)
    charged, cut_short = 0, False
    # uvicorn does not always tell the app that a client left (it then streams to the end):
    # each stream is charged what it produced either way, and one at least must be cut short
    for _ in range(STREAM_ATTEMPTS):
        produced = abandoned_stream(site)
        charged += produced
        poll_until(lambda: site.level() == burst - charged, 10,
                   f"the bucket charged the {charged} units produced (it holds {site.level()})")
        cut_short = produced < CHUNK_UNITS * STREAM_CHUNKS
        if cut_short:
            break
    assert cut_short, f"every one of {STREAM_ATTEMPTS} streams ran to its end"


STREAM_ATTEMPTS, STREAM_CHUNKS = 8, 10_000  # metered_site.stream's chunks


def abandoned_stream(site):
    """Read the first chunks of a stream, then leave; return the units the stream reported
    once the server has closed it."""
    name = uuid.uuid4().hex
    with socket.create_connection(("127.0.0.1", site.server.port), timeout=10) as client:
        client.sendall(f"GET {site.stream}?id={name} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                       .encode())
        received = 0
        while received < 200_000:  # a few chunks, then the client is gone
            received += len(client.recv(65_536))
    poll_until(lambda: site.notes.get(f"closed:{name}") is not None, 15,
               "the server to close the abandoned stream")
    produced = int(site.notes.get(f"produced:{name}"))
    assert produced >= CHUNK_UNITS * 3  # what the client read, at least
    return produced
