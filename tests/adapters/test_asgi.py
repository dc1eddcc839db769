"""The demo under a real ASGI server: uvicorn serving project.asgi with the demo data.

One uvicorn process (one worker: one event loop, so a blocked loop would show) on a free
127.0.0.1 port, with its own migrated SQLite file and the suite's redis-server. Real HTTP from
threads; each test sends from its own client IP (X-Forwarded-For, trusted from 127.0.0.1 with
DEMO_BEHIND_PROXY), so the server's local deny cache carries nothing from one test to the next.
The plain view ``hello`` is decided by QuotaMiddleware on its async path.
"""

import concurrent.futures
import os
import shutil
import time

import pytest

from ratelimit_app.stores.aio import CLIENT_NAME

from ..asgi_server import POLL_INTERVAL_S, Uvicorn, get, load_demo

TIGHT_BURST = 20          # the hello-tight rule: 20 requests per client IP, next one in an hour
SOCKET_TIMEOUT_S = 0.25   # the demo's Redis socket timeout (project/settings.py)
PRO_KEY = "rk_bob_pro"    # the demo's pro user: its hello rule fails closed

# The demo data plus two rules on the plain view: a tight one per client IP, and one for the pro
# plan that refuses requests while Redis cannot answer.
EXTRA_RULES = f"""
import django
django.setup()
from ratelimit_app.models import Plan, Rule
Rule.objects.create(name="hello-tight", plan=None, scope="ip", endpoint="hello", rate=1,
                    period_s=3600, burst={TIGHT_BURST})
Rule.objects.create(name="pro-hello-closed", plan=Plan.objects.get(slug="pro"), scope="user",
                    endpoint="hello", rate=1000, period_s=60, burst=1000,
                    on_redis_failure="closed")
"""


def concurrently(server, count, path, client_ip, headers=(), threads=32):
    """Send ``count`` requests from ``threads`` threads at once; return their Answers."""
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: get(server, path, client_ip, headers), range(count)))


def wait_until_deciding(server, client_ip, timeout_s=10):
    """Poll until the server decides with Redis again (breaker closed): an answer with the
    RateLimit field, which a decision made without Redis does not carry."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = get(server, "/hello/", client_ip)
        if answer.status == 200 and answer.headers.get("RateLimit"):
            return answer
        assert time.monotonic() < deadline, f"still not deciding: {answer.status}"
        time.sleep(POLL_INTERVAL_S)


@pytest.fixture(scope="module")
def server(tmp_path_factory, redis_server, database_env):
    workdir = tmp_path_factory.mktemp("asgi")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings",
           **database_env(workdir), "REDIS_URL": redis_server.url,
           "DEMO_BEHIND_PROXY": "1", "DJANGO_DEBUG": "0"}
    load_demo(env, EXTRA_RULES)
    uvicorn = Uvicorn(env, workdir).start()
    yield uvicorn
    uvicorn.stop()
    log = uvicorn.log()
    shutil.rmtree(workdir, ignore_errors=True)
    assert "Traceback" not in log, log


def test_concurrent_requests_never_over_grant_and_carry_headers(server, redis_server):
    answers = concurrently(server, 100, "/hello/", "198.51.100.1")
    statuses = [a.status for a in answers]
    allowed = statuses.count(200)
    print(f"\n100 concurrent requests, burst {TIGHT_BURST}: {allowed} allowed")
    assert TIGHT_BURST - 2 <= allowed <= TIGHT_BURST
    assert statuses.count(429) == 100 - allowed
    assert all(a.headers.get("RateLimit-Policy") for a in answers)
    assert all(a.headers.get("RateLimit") for a in answers if a.status == 200)
    refused = [a for a in answers if a.status == 429]
    assert all(int(a.headers["Retry-After"]) > 0 for a in refused)
    assert {tuple(a.json()["violated-policies"]) for a in refused} == {("hello-tight",)}

    # a CORS preflight is neither charged nor refused, an exempt path has no quota at all
    preflight = get(server, "/hello/", "198.51.100.1", method="OPTIONS",
                    headers={"Origin": "https://example.test",
                             "Access-Control-Request-Method": "GET"})
    assert preflight.status != 429
    health = get(server, "/health/", "198.51.100.1")
    assert health.status == 200 and "RateLimit-Policy" not in health.headers

    # the decisions were made by the asyncio client, by name on the server
    with redis_server.client() as client:
        names = {c["name"] for c in client.client_list()}
    assert CLIENT_NAME in names


def test_a_drf_view_and_a_plain_view_share_the_client_buckets(server):
    plain = get(server, "/hello/", "198.51.100.2")
    drf = get(server, "/api/items/", "198.51.100.2")  # QuotaThrottle, in the view's thread
    assert plain.status == drf.status == 200
    assert '"free-ip";r=39' in plain.headers["RateLimit"]
    assert '"free-ip";r=38' in drf.headers["RateLimit"]


def test_failed_authentications_are_charged_on_the_async_path(server):
    bogus = {"X-Api-Key": "rk_no_such_key"}
    answers = [get(server, "/hello/", "198.51.100.3", bogus) for _ in range(12)]
    assert [a.status for a in answers] == [200] * 10 + [429] * 2  # auth-failures: burst 10
    assert answers[-1].json()["violated-policies"] == ["auth-failures"]
    # the same client IP with no credentials is still refused: guessing stays limited
    assert get(server, "/hello/", "198.51.100.3").status == 429


def test_a_slow_redis_does_not_stall_the_event_loop(server, redis_server):
    """With EVALSHA held by CLIENT PAUSE, concurrent decisions wait on Redis together (each
    gives up after the socket timeout, then fails open) and a request that needs no Redis is
    served meanwhile. A decision blocking the loop would serialise them."""
    wait_until_deciding(server, "198.51.100.4")
    with redis_server.client() as client:
        client.client_pause(2000, all=False)  # WRITE: scripts wait, GET (version poll) does not
        try:
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                started = time.perf_counter()
                slow = [pool.submit(get, server, "/hello/", "198.51.100.4") for _ in range(6)]
                deadline = time.monotonic() + 5
                while client.info("clients")["blocked_clients"] == 0:
                    assert time.monotonic() < deadline, "no decision reached Redis"
                    time.sleep(0.005)  # poll interval
                health = get(server, "/health/")
                answers = [future.result() for future in slow]
                wall_s = time.perf_counter() - started
        finally:
            client.client_unpause()
    print(f"\n6 decisions held by a paused Redis: {wall_s * 1000:.0f} ms in all; "
          f"/health/ meanwhile {health.seconds * 1000:.1f} ms")
    assert health.status == 200 and health.seconds < SOCKET_TIMEOUT_S
    assert [a.status for a in answers] == [200] * 6  # fail open, no 5xx
    assert wall_s < 3 * SOCKET_TIMEOUT_S  # together, not one after the other (6 × 0.25 s)


def test_redis_killed_honours_fail_modes_with_no_5xx_and_recovers(server, redis_server):
    wait_until_deciding(server, "198.51.100.5")
    redis_server.kill()
    anonymous = concurrently(server, 60, "/hello/", "198.51.100.6")
    pro = concurrently(server, 30, "/hello/", "198.51.100.7", {"X-Api-Key": PRO_KEY})
    drf = concurrently(server, 30, "/api/items/", "198.51.100.8")
    everything = anonymous + pro + drf
    assert not [a.status for a in everything if a.status >= 500 or a.status == 0]
    assert {a.status for a in anonymous} == {200}      # the demo's rules fail open
    assert {a.status for a in drf} == {200}
    assert {a.status for a in pro} == {429}            # pro-hello-closed fails closed
    assert {a.json()["title"] for a in pro} == {"Temporarily reduced capacity"}

    redis_server.start()  # a new, empty server: no script, no config version
    recovered = wait_until_deciding(server, "198.51.100.9")
    assert '"hello-tight";r=' in recovered.headers["RateLimit"]
