"""The penalty box on real servers (issue 50): gunicorn with 3 sync workers, on a Redis node and
on the 3-master Cluster, and uvicorn with 2 (QuotaMiddleware's async path) on a node, with the
workers' background threads on. A scraper walking 404s is banned after exactly N across the
workers, every worker then refuses it, and a banned caller's flood costs Redis at most 0.1
commands per request (INFO commandstats, on the server; the workers' time-based background,
the watcher's polls and the metrics flush, is printed apart)."""

import json
import os
import threading

import pytest

from ..asgi_server import Gunicorn, Uvicorn, get
from ..config.test_reload_live import python, stop_server
from ..helpers import server_store

pytestmark = [pytest.mark.slow, pytest.mark.deployment, pytest.mark.database]

THRESHOLD, BAN_S = 7, 600
SETUP = f"""
import django
django.setup()
from ratelimit_app.models import BanRule, Plan, Rule
plan = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
Rule.objects.create(name="live-ip", plan=plan, scope="ip", rate=1000, period_s=1, burst=100000)
BanRule.objects.create(name="scrapers", scope="ip", events="statuses", statuses="404",
                       threshold={THRESHOLD}, window_s=600, ban_s={BAN_S}, factor=2)
"""
BANS = """
import json
import django
django.setup()
from ratelimit_app.models import Ban
print(json.dumps([[b.who, b.rule_name, b.times, b.shadow] for b in Ban.objects.all()]))
"""


SERVERS = {"gunicorn": (Gunicorn, 3), "uvicorn": (Uvicorn, 2)}


@pytest.fixture(scope="module", params=[("gunicorn", "redis"), ("gunicorn", "cluster"),
                                        ("uvicorn", "redis")], ids="-".join)
def deployment(request, tmp_path_factory, redis_server, database_env):
    kind, store = request.param
    server_class, workers = SERVERS[kind]
    workdir = tmp_path_factory.mktemp(f"bans-{kind}-{store}")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.config.propagation_settings",
           "RELOAD_INTERVAL_S": "30", **database_env(workdir), "DJANGO_DEBUG": "0"}
    client = server_store(request, store, env, redis_server)
    python(["manage.py", "migrate", "--verbosity", "0"], env)
    python(["-c", SETUP], env)
    server = server_class(env, workdir, workers=workers).start()
    topology = request.getfixturevalue("redis_cluster") if store == "cluster" else redis_server
    yield server, env, topology, workers
    stop_server(server)
    client.close()


def commands_sent(topology):
    """The commands the store's masters executed so far, by name (INFO commandstats)."""
    nodes = topology.masters() if hasattr(topology, "masters") else [topology]
    totals = {}
    for node in nodes:
        with node.client() as client:
            for name, stats in client.info("commandstats").items():
                totals[name] = totals.get(name, 0) + stats["calls"]
    return totals


def test_a_scraper_is_banned_after_exactly_n_across_workers_and_its_flood_is_nearly_free(
        deployment):
    server, env, topology, worker_count = deployment
    workers = set()
    for i in range(THRESHOLD - 1):
        assert get(server, f"/no-such-page-{i}/").status == 404
    for _ in range(6):  # N - 1 events: not banned, on any worker
        answer = get(server, "/hello/")
        assert answer.status == 200
        workers.add(answer.headers.get("RateLimit-Worker"))
    assert get(server, "/no-such-page-last/").status == 404  # the Nth
    assert json.loads(python(["-c", BANS], env)) == [["127.0.0.1", "scrapers", 1, False]]

    refused_by = set()
    for _ in range(300):  # until every worker has refused it (the kernel spreads connections)
        answer = get(server, "/hello/")
        assert answer.status == 429
        assert json.loads(answer.body)["banned-by"] == ["scrapers"]
        assert 0 < int(answer.headers["Retry-After"]) <= BAN_S
        refused_by.add(answer.headers.get("RateLimit-Worker"))
        if len(refused_by) == worker_count:
            break
    assert len(refused_by) == worker_count  # every worker refuses the banned caller

    # the flood: 10,000 requests, answered by the workers' deny caches
    before = commands_sent(topology)
    statuses = []

    def flood(count):
        statuses.extend(get(server, "/hello/").status for _ in range(count))

    threads = [threading.Thread(target=flood, args=(2500,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = commands_sent(topology)
    spent_by = {name: after[name] - before.get(name, 0) for name in after
                if after[name] != before.get(name, 0)}
    spent = sum(spent_by.values())
    assert statuses == [429] * 10_000
    print(f"banned flood: {spent} Redis commands for 10,000 requests "
          f"({spent / 10_000:.4f} per request): {spent_by}")
    # what the requests sent: the scripts of the decision path (take.lua, ban.lua; EVALSHA) and
    # the commands they ran. The rest is time-based background that does not grow with
    # requests: each worker's watcher (a GET every 50 ms) and its metrics flush (once a second)
    scripts = spent_by.get("cmdstat_evalsha", 0)
    inside = sum(spent_by.get(f"cmdstat_{name}", 0) for name in ("mget", "time"))
    assert scripts + inside <= 0.1 * 10_000
