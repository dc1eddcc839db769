"""The Django Ninja APIs of tests/adapters/ninja_api.py under real servers: gunicorn with two
sync workers and uvicorn with two workers (its event loop runs the async operations and their
throttle), each with its own migrated SQLite file and the suite's redis-server. Real HTTP from
threads; each test sends from its own client IP (X-Forwarded-For, trusted from 127.0.0.1 with
DEMO_BEHIND_PROXY)."""

import concurrent.futures
import os
import shutil

import pytest

pytest.importorskip("ninja")

from ..asgi_server import Gunicorn, Uvicorn, get, load_demo  # noqa: E402

pytestmark = [pytest.mark.deployment, pytest.mark.slow]

BURST = 12  # the tight rule: 12 requests per pro user and operation, the next one in an hour

# The demo data, a tight rule per async and sync operation for the pro plan, and a cost on the
# POST operation of a path whose GET is another operation.
EXTRA_ROWS = f"""
import django
django.setup()
from ratelimit_app.models import EndpointCost, Plan, Rule
pro = Plan.objects.get(slug="pro")
for endpoint in ("ninja:keyed", "ninja:keyed_async"):
    Rule.objects.create(name=f"tight-{{endpoint[6:]}}", plan=pro, scope="user",
                        endpoint=endpoint, rate=1, period_s=3600, burst={BURST})
EndpointCost.objects.create(endpoint="ninja:create_item", method="POST", cost=7)
"""

SERVERS = {"gunicorn": Gunicorn, "uvicorn": lambda env, workdir: Uvicorn(env, workdir, 2)}


@pytest.fixture(scope="module", params=sorted(SERVERS))
def server(request, tmp_path_factory, redis_server, database_env):
    workdir = tmp_path_factory.mktemp(f"ninja-{request.param}")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.adapters.ninja_settings",
           **database_env(workdir), "REDIS_URL": redis_server.url,
           "DEMO_BEHIND_PROXY": "1", "DJANGO_DEBUG": "0"}
    load_demo(env, EXTRA_ROWS)
    running = SERVERS[request.param](env, workdir).start()
    yield running
    running.stop()
    log = running.log()
    shutil.rmtree(workdir, ignore_errors=True)
    assert "Traceback" not in log, log


def concurrently(server, count, path, client_ip, headers, method="GET"):
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda _: get(server, path, client_ip, headers, method),
                             range(count)))


@pytest.mark.parametrize("path", ["/ninja/keyed", "/ninja/async-keyed"])
def test_concurrent_requests_are_refused_past_the_burst_with_problem_responses(server, path):
    client_ip = f"198.51.100.{1 if 'async' in path else 2}"
    answers = concurrently(server, 3 * BURST, path, client_ip, {"X-User-Key": "key-bob"})
    allowed = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 429]
    assert len(allowed) == BURST and len(refused) == 2 * BURST, \
        sorted(a.status for a in answers)
    assert all(a.json() == {"user": "bob"} for a in allowed)
    assert all(a.headers["RateLimit-Policy"] for a in allowed)
    levels = sorted(int(member.split(";r=")[1].split(";")[0])
                    for a in allowed for member in a.headers["RateLimit"].split(", ")
                    if member.startswith('"tight-'))
    assert levels == list(range(BURST))  # every token handed out once, none twice
    for answer in refused:
        assert answer.headers["Content-Type"] == "application/problem+json"
        body = answer.json()
        assert body["status"] == 429 and body["violated-policies"][0].startswith("tight-")
        assert int(answer.headers["Retry-After"]) == body["retry-after"] >= 3000
        assert answer.headers["RateLimit"]


def test_the_caller_comes_from_ninjas_auth_and_costs_name_operations(server):
    bearer = get(server, "/ninja/bearer", "198.51.100.3", {"Authorization": "Bearer token-carol"})
    assert bearer.status == 200 and '"enterprise-user";r=999' in bearer.headers["RateLimit"]
    listed = get(server, "/ninja/items", "198.51.100.4")
    created = get(server, "/ninja/items", "198.51.100.4", method="POST")
    assert (listed.status, created.status) == (200, 200)
    assert '"free-ip";r=39' in listed.headers["RateLimit"]
    assert '"free-ip";r=32' in created.headers["RateLimit"]  # create_item costs 7


def test_an_operation_without_quota_throttle_is_decided_by_the_middleware(server):
    answer = get(server, "/ninja-parts/middleware", "198.51.100.5", {"X-User-Key": "key-bob"})
    assert answer.status == 200
    # decided before Ninja's auth ran: the client IP's free-plan buckets
    assert '"free-ip";r=39' in answer.headers["RateLimit"]


@pytest.mark.parametrize("path", ["/ninja/health", "/ninja/async-health", "/ninja-parts/exempt",
                                  "/ninja-parts/exempt-throttled"])
def test_an_exempt_operation_makes_no_redis_call(server, redis_server, path):
    # uvicorn runs QuotaMiddleware in async mode and the async operation's throttle on its loop
    calls = redis_server.command_calls("evalsha")
    answers = [get(server, path, "198.51.100.6", {"X-User-Key": "key-bob"}) for _ in range(4)]
    assert [a.status for a in answers] == [200] * 4
    assert not any("RateLimit" in a.headers for a in answers)
    assert redis_server.command_calls("evalsha") == calls
