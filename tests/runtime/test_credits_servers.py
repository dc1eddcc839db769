"""Prepaid credits with real servers: gunicorn (3 sync workers) and uvicorn (2 workers, async
views on the event loop) side by side on one database, on the suite's redis-server and on
the 3-master Cluster, serving tests/runtime/credits_site.py. Concurrent callers spend one API
key's balance through both servers; the balance in Redis and the ledger in the database are
read afterwards: a balance never goes below its debt bound, the ledger holds to the unit what
the requests were charged, a balance Redis lost (kill -9, no persistence) is rebuilt from the
last checkpoint, a stream its client abandoned is charged what it produced, and the usage
records of a request cut at the debt bound bill what it was charged, not what it reported."""

import concurrent.futures
import math
import os
import random
import socket
import threading
import time
import uuid
from urllib.parse import urlencode

import pytest

from ratelimit_app.decision.balances import BalanceState, account_key

from ..asgi_server import Gunicorn, Uvicorn, get
from ..config.test_reload_live import python, stop_server
from ..helpers import poll_until, server_store

pytestmark = pytest.mark.slow

ESTIMATE, MINIMUM = 10, 1  # the metered endpoints' cost and minimum charge
DEBT = 40                  # the credits rule's debt bound, in units
OK_BURST = 20              # the tenant's calls of /ok/ (a token an hour: none refills meanwhile)
CHUNK_UNITS = 5            # metered_site.CHUNK_UNITS
STREAM_CHUNKS = 10_000     # the streams' chunks

# The prepaid plan (credits, and an endpoint rule per tenant), the metered endpoints, and a rule
# for anonymous callers: a key a worker does not know yet (created a moment ago) makes its
# request anonymous, and only a request that calls take.lua is fenced by the config version
# (it then decides again on fresh rules, the key known): without one it would pass uncharged
SETUP = f"""
import django
django.setup()
from ratelimit_app.models import EndpointCost, Plan, Rule
plan = Plan.objects.create(slug="prepaid", name="Prepaid")
free = Plan.objects.create(slug="free", name="Free", default_for_anonymous=True)
for rule in (
        Rule(name="anonymous", plan=free, scope="ip", rate=1000, period_s=1, burst=10**6),
        Rule(name="credits", plan=plan, scope="user", kind="credits", rate=0, debt={DEBT},
             on_redis_failure="closed"),
        Rule(name="ok-per-tenant", plan=plan, scope="tenant", endpoint="ok", rate=1,
             period_s=3600, burst={OK_BURST})):
    rule.full_clean()
    rule.save()
for endpoint in ("units", "aunits", "stream", "astream"):
    EndpointCost.objects.create(endpoint=endpoint, cost={ESTIMATE}, metered=True,
                                minimum={MINIMUM})
"""


class Site:
    """gunicorn and uvicorn serving credits_site on one store and database. Request ``index``
    goes to one server or the other (a metered request to the sync view on gunicorn, to the
    async view on uvicorn)."""

    def __init__(self, store, gunicorn, uvicorn, store_client, notes):
        self.store, self.gunicorn, self.uvicorn = store, gunicorn, uvicorn
        self.store_client, self.notes = store_client, notes

    def server(self, index):
        return (self.gunicorn, self.uvicorn)[index % 2]

    def metered(self, account, index, units):
        """A metered request that reports ``units`` consumed."""
        view = "/units/" if index % 2 == 0 else "/aunits/"
        return get(self.server(index), f"{view}?n={units}", headers=account.headers)

    def call(self, account, index, view):
        """A request of ``view`` ("plain": cost 1; "ok": cost 1, the tenant's endpoint rule)."""
        return get(self.server(index), f"/{view}/", headers=account.headers)

    def operation(self, name, **query):
        """Run a credits_site operation in a gunicorn worker; return its JSON answer."""
        answer = get(self.gunicorn, f"/ops/{name}/?{urlencode(query)}", method="POST")
        assert answer.status == 200, (answer.status, answer.body[:500])
        return answer.json()

    def balance(self, account):
        """The account's balance as Redis holds it (None if it holds none)."""
        return BalanceState.unpack(self.store_client.get(account_key("rl", account.ref)))

    def left(self, account):
        """Prepaid units left (no allowance: granted − spent; below 0 in debt)."""
        state = self.balance(account)
        return None if state is None else state.granted - state.spent


class Account:
    """An API key (on the prepaid plan, in a tenant of its own) and its credit account."""

    def __init__(self, raw, ref):
        self.raw, self.ref = raw, ref
        self.headers = {"X-Api-Key": raw}


@pytest.fixture(scope="module", params=["redis", "cluster"])
def site(request, tmp_path_factory, redis_server, database_env):
    """gunicorn and uvicorn on the store ``request.param`` names (the suite's redis-server or
    the Cluster) and on one migrated database of their own; returns a Site."""
    store = request.param
    workdir = tmp_path_factory.mktemp(f"credits-{store}")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.runtime.credits_site",
           **database_env(workdir), "NOTES_REDIS_URL": redis_server.url, "DJANGO_DEBUG": "0"}
    store_client = server_store(request, store, env, redis_server)
    python(["manage.py", "migrate", "--verbosity", "0"], env)
    python(["-c", SETUP], env)
    servers = (Gunicorn(env, workdir, workers=3), Uvicorn(env, workdir, workers=2))
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda server: server.start(timeout_s=60), servers))
        yield Site(store, *servers, store_client, redis_server.client())
    finally:
        for server in servers:
            stop_server(server)


def new_account(site, units):
    """A new API key, topped up with ``units`` (Redis told at once, as a real top-up is)."""
    made = site.operation("key", tenant=f"t-{uuid.uuid4().hex[:12]}")
    account = Account(made["raw"], made["ref"])
    top_up(site, account, units)
    return account


def top_up(site, account, units):
    return site.operation("top-up", ref=account.ref, units=units, id=uuid.uuid4().hex)


def rolled_up(site, account, allowed, spent):
    """Run ``manage.py ratelimit rollup`` until the usage records count the ``allowed``
    requests (each worker flushes its counts every second) and the checkpoint holds ``spent``;
    return the account's ledger (its row and usage)."""
    ledger = {}

    def read():
        site.operation("rollup")
        ledger.update(site.operation("ledger", ref=account.ref))
        return ledger["usage"].get("credits", {}).get("allowed"), ledger["spent"]

    reaches(read, (allowed, spent), "the usage records' allowed requests and the checkpoint's "
                                    "spent units", timeout_s=20)
    return ledger


def reaches(read, expected, what, timeout_s=15):
    """Return once ``read()`` returns ``expected`` (what a server does after its response, in
    its own time); fail after ``timeout_s``, naming what it returned last."""
    seen = []

    def reached():
        seen.append(read())
        return seen[-1] == expected

    try:
        poll_until(reached, timeout_s, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {expected} expected, {seen[-1]} read last") from None


def refused_for_credits(answer):
    return answer.status == 402 and answer.json()["credits-exhausted"] == ["credits"]


# --- the debt bound under concurrency -----------------------------------------------------------

def test_concurrent_callers_never_take_a_balance_below_its_debt_bound(site):
    prepaid = 300
    account = new_account(site, prepaid)
    levels, answers = [], []

    def call(index):
        started = time.monotonic()
        answer = site.metered(account, index, units=90)  # 80 more than the estimate
        answers.append((started, time.monotonic(), answer))
        levels.append(site.left(account))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(call, range(60)))
    statuses = [answer.status for _, _, answer in answers]
    assert set(statuses) <= {200, 402} and 402 in statuses, statuses
    assert all(refused_for_credits(answer) for _, _, answer in answers if answer.status == 402)
    # nothing gives units back here: once a request was refused, every later one is
    first_refusal = min(ended for _, ended, answer in answers if answer.status == 402)
    assert all(answer.status == 402 for started, _, answer in answers if started > first_refusal)
    # a settle runs after the client has its response: wait for the last one
    reaches(lambda: site.left(account), -DEBT, "the balance at its debt bound")
    assert min(level for level in levels if level is not None) >= -DEBT
    allowed = statuses.count(200)
    # each allowed request was admitted on its estimate and charged at least it
    assert math.ceil((prepaid + DEBT) / 90) <= allowed <= prepaid // ESTIMATE
    assert [site.metered(account, index, units=1).status for index in range(2)] == [402, 402]

    ledger = rolled_up(site, account, allowed, prepaid + DEBT)
    assert ledger["granted"] == prepaid
    assert site.balance(account).spent == prepaid + DEBT


def test_usage_records_bill_what_a_balance_cut_at_its_debt_bound_was_charged(site):
    prepaid = 15
    account = new_account(site, prepaid)
    assert site.metered(account, 0, units=90).status == 200  # admitted on 10 of the 15
    reaches(lambda: site.left(account), -DEBT, "the balance at its debt bound")
    ledger = rolled_up(site, account, 1, prepaid + DEBT)  # 55 charged of the 90 reported
    assert ledger["usage"]["credits"]["units"] == prepaid + DEBT


# --- the ledger reconciles ----------------------------------------------------------------------

def test_the_ledger_holds_what_the_requests_were_charged_to_the_unit(site):
    draw = random.Random(34)
    # first, requests the balance can all pay: metered ones reporting less and more than the
    # estimate, and calls of /ok/ past the tenant's endpoint limit (refused 429; on the Cluster
    # the balance's slot may have debited first: refund.lua gives it back)
    first = [("units", draw.choice([0, 3, ESTIMATE, 17, 25])) for _ in range(40)]
    first += [("ok", 1)] * (OK_BURST + 10)
    draw.shuffle(first)
    headroom = 150  # more than 8 callers in flight ever hold at once
    granted = sum(max(units, MINIMUM) for view, units in first if view == "units") \
        + OK_BURST + headroom
    account = new_account(site, granted)

    def send(index, view, units):
        if view == "ok":
            return site.call(account, index, "ok")
        return site.metered(account, index, units)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: send(job[0], *job[1]), enumerate(first)))
    statuses = [answer.status for answer in answers]
    charged = [max(units, MINIMUM) for (_, units), status in zip(first, statuses)
               if status == 200]
    assert [status for (view, _), status in zip(first, statuses) if view == "units"] \
        == [200] * 40
    assert sorted(status for (view, _), status in zip(first, statuses) if view == "ok") \
        == [200] * OK_BURST + [429] * 10
    reaches(lambda: site.left(account), headroom, "the balance left after the first requests")

    # then callers spend it down to 402; at the first 402 another top-up comes in while they
    # keep going, until each has been refused after it
    refused, topped_up = threading.Event(), threading.Event()
    second_top_up = 150
    lock = threading.Lock()

    def top_up_when_refused():
        assert refused.wait(60), "no 402 before the second top-up"
        top_up(site, account, second_top_up)
        topped_up.set()

    def spend(caller):
        draws = random.Random(caller)
        for index in range(200):
            if index % 5 == 4:
                answer, units = site.call(account, caller + index, "ok"), 1
                assert answer.status in (402, 429), answer.status
            else:
                units = draws.choice([0, 3, ESTIMATE])  # never more than held: nothing cut
                answer = site.metered(account, caller + index, units)
            assert answer.status in (200, 402, 429), answer.status
            with lock:
                if answer.status == 200:
                    charged.append(max(units, MINIMUM))
            if answer.status == 402:
                assert refused_for_credits(answer)
                if topped_up.is_set():
                    return
                refused.set()
        raise AssertionError(f"caller {caller} was never refused after the second top-up")

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        done = [pool.submit(top_up_when_refused)] + [pool.submit(spend, c) for c in range(8)]
        for future in done:
            future.result()

    granted += second_top_up
    spent = sum(charged)
    reaches(lambda: site.balance(account).spent, spent,
            "the balance's spent at the units the clients were charged")
    ledger = rolled_up(site, account, len(charged), spent)
    state = site.balance(account)
    assert (ledger["granted"], ledger["spent"]) == (granted, spent)
    assert (state.granted, state.spent) == (granted, spent)
    assert ledger["granted"] - ledger["spent"] == site.left(account)
    # the usage records bill what the credits rule charged, settled costs included
    assert ledger["usage"]["credits"]["units"] == spent


# --- a balance Redis lost ------------------------------------------------------------------------

def test_a_balance_redis_lost_is_rebuilt_from_the_last_checkpoint(site, redis_server):
    if site.store == "cluster":
        pytest.skip("kill -9 of a Cluster master is a failover (tests/stores/test_cluster.py)")
    prepaid, before, after = 30, 8, 5
    account = new_account(site, prepaid)
    assert [site.call(account, i, "plain").status for i in range(before)] == [200] * before
    assert rolled_up(site, account, before, before)["spent"] == before  # the checkpoint
    assert [site.call(account, i, "plain").status for i in range(after)] == [200] * after
    assert site.balance(account).spent == before + after

    redis_server.kill()  # kill -9; restarted empty (no persistence), on the same port
    redis_server.start()
    assert site.balance(account) is None
    # the next request rebuilds the balance from the ledger: the prepaid units minus the
    # checkpoint's spent; the units spent after the checkpoint are spent again, no more
    answers = []
    deadline = time.monotonic() + 60
    while not any(answer.status == 402 for answer in answers):
        assert time.monotonic() < deadline and len(answers) < 100, \
            [answer.status for answer in answers]
        answers.append(site.call(account, len(answers), "plain"))
    statuses = [answer.status for answer in answers]
    # (a 429 is the rule's fail mode, closed, while a worker had not reconnected: no charge)
    assert set(statuses) <= {200, 402, 429}, statuses
    assert all(answer.json()["title"] == "Temporarily reduced capacity"
               for answer in answers if answer.status == 429)
    assert statuses.count(200) == prepaid - before, statuses
    # served in all: the prepaid units and, twice, the `after` units since the checkpoint
    assert before + after + statuses.count(200) == prepaid + after
    state = site.balance(account)
    assert (state.granted, state.spent) == (prepaid, prepaid)


# --- a stream its client abandons ----------------------------------------------------------------

def test_a_stream_its_client_abandons_is_charged_what_it_produced(site):
    account = new_account(site, 10**6)
    charged = 0
    for server, view in ((site.gunicorn, "/stream/"), (site.uvicorn, "/astream/")):
        produced = abandoned_stream(site, server, view, account)
        assert produced < CHUNK_UNITS * STREAM_CHUNKS, f"{view} ran to its end"
        charged += produced
        reaches(lambda: site.balance(account).spent, charged,
                "the balance charged the units the streams produced")


def abandoned_stream(site, server, view, account):
    """Read the first chunks of a stream, then leave; return the units the stream reported
    once the server has closed it."""
    name = uuid.uuid4().hex
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(f"GET {view}?id={name} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       f"X-Api-Key: {account.raw}\r\n\r\n".encode())
        received = b""
        while len(received) < 200_000:  # a few chunks, then the client is gone
            chunk = client.recv(65_536)
            assert chunk, f"the server ended the stream first: {received[:300]}"
            received += chunk
    poll_until(lambda: site.notes.get(f"closed:{name}") is not None, 30,
               "the server to close the abandoned stream")
    produced = int(site.notes.get(f"produced:{name}"))
    assert produced >= CHUNK_UNITS * 3  # what the client read, at least
    return produced
