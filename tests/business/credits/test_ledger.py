"""The ledger of prepaid credits on the suite's real redis-server (business/credits/ledger.py):
top-ups credited once per id (retries, conflicts, threads at once), the request path's seed,
the checkpoint that rebuilds what Redis lost, and the balance read for display.

The request path's own writes to a balance (take/settle/refund) are stood in for by writing
the balance's value directly, in its layout (decision/balances.py)."""

import signal
import threading

import pytest
import redis
from django.contrib.auth import get_user_model
from redis.backoff import NoBackoff
from redis.retry import Retry

from ratelimit_app.business.credits.ledger import (
    TopUpConflict,
    balance,
    checkpoint,
    seed,
    top_up,
)
from ratelimit_app.business.credits.refs import CreditInputError
from ratelimit_app.decision.balances import BalanceState, account_key
from ratelimit_app.models import CreditAccount, CreditTopUp
from ratelimit_app.testing import RedisServer

from ...helpers import api_key, poll_until

PREFIX = "rl"


def stored(client, ref):
    """The BalanceState Redis holds for ``ref`` (None: none)."""
    return BalanceState.unpack(client.get(account_key(PREFIX, ref)))


def store(client, ref, state):
    """Write ``state`` as the request path would have left it."""
    client.set(account_key(PREFIX, ref), state.pack())


def row(ref):
    """The account row's (granted, spent, used, period_start_ms, seq)."""
    account = CreditAccount.objects.get(ref=ref)
    return BalanceState(account.granted, account.spent, account.used, account.period_start_ms,
                        account.seq)


def quick_client(server):
    """A client of ``server`` that gives up after 0.3 s (a stopped server answers nothing)."""
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=0.3,
                       socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 0))


def credit(client, ref, units, top_up_id, **options):
    return top_up(ref, units, top_up_id, actor="test", client=client, prefix=PREFIX, **options)


# --- top-ups ---------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_top_up_raises_the_ledger_and_the_balance_once(redis_client,
                                                         django_capture_on_commit_callbacks):
    store(redis_client, "tenant:acme", BalanceState(100, 40, 3, 1_700_000_000_000, 9))
    CreditAccount.objects.create(ref="tenant:acme", granted=100, seq=9)
    with django_capture_on_commit_callbacks(execute=True):
        made, created = credit(redis_client, "tenant:acme", 500, "inv-1", note="March")
    assert created and made.units == 500 and made.note == "March" and made.actor == "test"
    assert row("tenant:acme").granted == 600
    # granted raised, what the request path wrote kept, seq + 1
    assert stored(redis_client, "tenant:acme") == BalanceState(600, 40, 3, 1_700_000_000_000, 10)

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        again, created = credit(redis_client, "tenant:acme", 500, "inv-1")
    assert not created and again.pk == made.pk and callbacks == []  # nothing to apply
    assert row("tenant:acme").granted == 600 and CreditTopUp.objects.count() == 1
    assert stored(redis_client, "tenant:acme").seq == 10

    with pytest.raises(TopUpConflict, match="“inv-1” was used for 500 units to tenant:acme; "
                                            "this top-up is 400 units to tenant:acme"):
        credit(redis_client, "tenant:acme", 400, "inv-1")
    with pytest.raises(TopUpConflict, match="this top-up is 500 units to tenant:globex"):
        credit(redis_client, "tenant:globex", 500, "inv-1")
    assert row("tenant:acme").granted == 600 and CreditTopUp.objects.count() == 1


@pytest.mark.django_db
def test_a_first_top_up_makes_the_account_and_sets_a_missing_balance(
        redis_client, django_capture_on_commit_callbacks):
    key, _ = api_key("ann")
    ref = f"key:0{key.id}"  # written as the request path writes it: key:<id>
    with django_capture_on_commit_callbacks(execute=True):
        made, created = credit(redis_client, ref, 250, "inv-7")
    account = made.account
    assert created and account.ref == f"key:{key.id}" and account.granted == 250
    assert account.display == f"key {key.prefix}… (ann's key)"
    # missing in Redis: set to the row's state (a seed that read the row before the commit
    # cannot set a balance without this top-up)
    assert stored(redis_client, account.ref) == BalanceState(250, 0, 0, 0, 0)


@pytest.mark.django_db
def test_bad_top_ups_are_refused_with_what_to_send(redis_client):
    user = get_user_model().objects.create_user("bob")
    cases = [
        (("acme", 5, "a"), ("“acme” names no account: write key:<API key id>, "
                            "user:<user id> or tenant:<name>")),
        (("key:x", 5, "a"), "names no account"),
        (("user:0", 5, "a"), "names no account"),
        (("tenant:" + "x" * 151, 5, "a"), "up to 150 printable characters"),
        (("user:999999", 5, "a"), r"There is no user with id 999999 \(the account user:999999\)"),
        (("key:999999", 5, "a"), "There is no API key with id 999999"),
        ((f"user:{user.id}", 0, "a"), r"units must be a whole number from 1 to 10\^12 \(got '0'\)"),
        ((f"user:{user.id}", 10**12 + 1, "a"), "from 1 to 10\\^12"),
        ((f"user:{user.id}", 2.5, "a"), "whole number"),
        ((f"user:{user.id}", True, "a"), "whole number"),
        ((f"user:{user.id}", "-3", "a"), "whole number"),
        ((f"user:{user.id}", 5, ""), "The top-up id must be 1 to 100 printable characters"),
        ((f"user:{user.id}", 5, "x" * 101), "1 to 100 printable characters"),
        ((f"user:{user.id}", 5, "tab\there"), "printable"),
        ((f"user:{user.id}", 5, " padded"), "without spaces at either end"),
        ((f"user:{user.id}", 5, None), "printable"),
    ]
    for args, message in cases:
        with pytest.raises(CreditInputError, match=message):
            credit(redis_client, *args)
    with pytest.raises(CreditInputError, match="at most 500 characters"):
        credit(redis_client, f"user:{user.id}", 5, "a", note="n" * 501)
    assert not CreditTopUp.objects.exists() and not CreditAccount.objects.exists()
    made, _ = credit(redis_client, f"user:{user.id}", 10**12, "max")
    assert made.account.display == "bob" and made.units == 10**12


@pytest.mark.django_db(transaction=True)  # real commits: each thread's transaction is its own
def test_retries_of_one_top_up_from_several_threads_at_once_credit_once(redis_client):
    from django.db import connection

    if connection.vendor == "sqlite":
        pytest.skip("SQLite's in-memory test database (shared cache) fails a second writer at "
                    "once instead of making it wait; the processes test covers SQLite (a file)")
    CreditAccount.objects.create(ref="tenant:acme", granted=10)
    seed(redis_client, PREFIX, ["tenant:acme"])
    start = threading.Barrier(6)
    results, errors = [], []

    def retry():
        try:
            start.wait(10)
            results.append(credit(redis_client, "tenant:acme", 70, "inv-race")[1])
        except Exception as exc:  # reported below: an assertion in a thread is lost
            errors.append(exc)
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=retry) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and sorted(results) == [False] * 5 + [True]
    assert CreditTopUp.objects.filter(top_up_id="inv-race").count() == 1
    assert row("tenant:acme").granted == 80
    assert stored(redis_client, "tenant:acme").granted == 80


# --- the request path's seed -----------------------------------------------------------------

@pytest.mark.django_db
def test_seed_sets_missing_balances_from_their_rows_in_one_query(redis_client,
                                                                 django_assert_num_queries):
    CreditAccount.objects.create(ref="tenant:acme", granted=500, spent=120, used=4,
                                 period_start_ms=1_700_000_000_000, seq=31)
    CreditAccount.objects.create(ref="tenant:globex", granted=50, seq=2)
    store(redis_client, "tenant:globex", BalanceState(50, 49, 0, 0, 7))  # set meanwhile: kept
    with django_assert_num_queries(1):
        assert seed(redis_client, PREFIX, ["tenant:acme", "tenant:globex", "tenant:acme"]) == 1
    assert stored(redis_client, "tenant:acme") == BalanceState(500, 120, 4, 1_700_000_000_000, 31)
    assert stored(redis_client, "tenant:globex") == BalanceState(50, 49, 0, 0, 7)
    assert redis_client.ttl(account_key(PREFIX, "tenant:acme")) == -1  # money: no TTL
    assert seed(redis_client, PREFIX, []) == 0


@pytest.mark.django_db
def test_seed_of_an_account_never_seen_makes_an_empty_one(redis_client):
    user = get_user_model().objects.create_user("carol")
    assert seed(redis_client, PREFIX, [f"user:{user.id}", "tenant:new"]) == 2
    assert stored(redis_client, f"user:{user.id}") == BalanceState(0, 0, 0, 0, 0)
    assert dict(CreditAccount.objects.values_list("ref", "display")) == {
        f"user:{user.id}": "carol", "tenant:new": "tenant new"}


# --- checkpoints -----------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_checkpoint_copies_each_balance_into_its_row(redis_client):
    CreditAccount.objects.create(ref="tenant:acme", granted=500, seq=3)
    CreditAccount.objects.create(ref="tenant:idle", granted=10)
    store(redis_client, "tenant:acme", BalanceState(500, 180, 6, 1_700_000_000_000, 40))
    store(redis_client, "tenant:idle", BalanceState(10, 0, 0, 0, 0))
    result = checkpoint(redis_client, PREFIX)
    assert result == (2, 0, 0, 0)
    assert row("tenant:acme") == BalanceState(500, 180, 6, 1_700_000_000_000, 40)
    assert row("tenant:idle") == BalanceState(10, 0, 0, 0, 0)
    assert all(a.checkpointed_at for a in CreditAccount.objects.all())
    assert stored(redis_client, "tenant:acme") == BalanceState(500, 180, 6, 1_700_000_000_000, 40)


@pytest.mark.django_db
def test_a_balance_redis_lost_is_set_again_from_the_checkpoint(redis_client):
    CreditAccount.objects.create(ref="tenant:acme", granted=500)
    store(redis_client, "tenant:acme", BalanceState(500, 180, 0, 0, 40))
    checkpoint(redis_client, PREFIX)
    redis_client.delete(account_key(PREFIX, "tenant:acme"))  # a flush, a lost node
    assert checkpoint(redis_client, PREFIX) == (1, 1, 0, 0)
    assert stored(redis_client, "tenant:acme") == BalanceState(500, 180, 0, 0, 40)


@pytest.mark.django_db
def test_an_older_balance_in_redis_is_restored_to_the_checkpoint(redis_client, caplog):
    CreditAccount.objects.create(ref="tenant:acme", granted=500)
    store(redis_client, "tenant:acme", BalanceState(500, 450, 2, 1_700_000_000_000, 60))
    checkpoint(redis_client, PREFIX)
    CreditAccount.objects.filter(ref="tenant:acme").update(granted=900)  # a top-up since
    # a failover to a replica that missed the last writes (or a restore from an older copy)
    store(redis_client, "tenant:acme", BalanceState(500, 300, 0, 0, 41))
    assert checkpoint(redis_client, PREFIX) == (1, 0, 1, 0)
    assert stored(redis_client, "tenant:acme") == BalanceState(900, 450, 2, 1_700_000_000_000, 60)
    assert row("tenant:acme") == BalanceState(900, 450, 2, 1_700_000_000_000, 60)
    assert "Redis held an older balance of tenant:acme than the checkpoint (seq 60" in \
        caplog.text
    # Redis moved on from there: nothing restored again
    store(redis_client, "tenant:acme", BalanceState(900, 500, 2, 1_700_000_000_000, 61))
    assert checkpoint(redis_client, PREFIX) == (1, 0, 0, 0)
    assert row("tenant:acme").spent == 500


@pytest.mark.django_db
def test_a_top_up_redis_missed_is_applied_by_the_next_checkpoint(
        redis_client, django_capture_on_commit_callbacks, caplog, server_executable):
    # a Redis of its own, stopped (SIGSTOP: it holds its data, and answers nothing) while the
    # top-up commits
    server = RedisServer(executable=server_executable).start()
    try:
        client = quick_client(server)
        CreditAccount.objects.create(ref="tenant:acme", granted=100)
        seed(client, PREFIX, ["tenant:acme"])
        store(client, "tenant:acme", BalanceState(100, 90, 0, 0, 12))
        server.process.send_signal(signal.SIGSTOP)
        try:
            with django_capture_on_commit_callbacks(execute=True):
                _, created = credit(client, "tenant:acme", 400, "inv-9")
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert created and row("tenant:acme").granted == 500  # the ledger has it
        assert "the top-up of tenant:acme is not in Redis yet" in caplog.text
        client = server.client()  # a fresh connection (the stopped one timed out mid-reply)
        poll_until(lambda: client.ping(), what="the resumed redis-server")
        assert stored(client, "tenant:acme") == BalanceState(100, 90, 0, 0, 12)

        assert checkpoint(client, PREFIX) == (1, 0, 0, 1)
        assert stored(client, "tenant:acme") == BalanceState(500, 90, 0, 0, 13)
        assert row("tenant:acme") == BalanceState(500, 90, 0, 0, 13)
    finally:
        server.stop()


@pytest.mark.django_db
def test_a_top_up_while_redis_is_down_is_set_by_the_checkpoint_once_it_is_back(
        django_capture_on_commit_callbacks, server_executable):
    # the server gone entirely (its data with it, no persistence): the checkpoint seeds
    server = RedisServer(executable=server_executable).start()
    try:
        CreditAccount.objects.create(ref="tenant:acme", granted=100, spent=30, seq=4)
        seed(server.client(), PREFIX, ["tenant:acme"])
        server.kill()
        client = quick_client(server)
        with django_capture_on_commit_callbacks(execute=True):
            assert credit(client, "tenant:acme", 50, "inv-10")[1]
        with pytest.raises(redis.ConnectionError):
            checkpoint(client, PREFIX)
        server.start()
        assert checkpoint(server.client(), PREFIX) == (1, 1, 0, 0)
        assert stored(server.client(), "tenant:acme") == BalanceState(150, 30, 0, 0, 4)
    finally:
        server.stop()


@pytest.mark.django_db
def test_two_checkpoints_never_write_an_older_state_over_a_newer_one(redis_client):
    from ratelimit_app.business.credits.ledger import _write_back

    account = CreditAccount.objects.create(ref="tenant:acme", granted=100, spent=80, seq=50)
    _write_back(account.pk, BalanceState(100, 60, 0, 0, 45), None)  # a slower checkpoint's
    assert row("tenant:acme") == BalanceState(100, 80, 0, 0, 50)


# --- reading a balance -----------------------------------------------------------------------

@pytest.mark.django_db
def test_balance_shows_redis_or_else_the_checkpoint_and_the_last_top_up(
        redis_client, django_capture_on_commit_callbacks):
    assert balance("tenant:acme", redis_client, PREFIX) is None  # no account yet
    with django_capture_on_commit_callbacks(execute=True):
        credit(redis_client, "tenant:acme", 100, "inv-1")
        credit(redis_client, "tenant:acme", 300, "inv-2", note="April")
    redis_client.delete(account_key(PREFIX, "tenant:acme"))
    found = balance("tenant:acme", redis_client, PREFIX)
    assert found.source == "checkpoint" and found.state[:2] == (400, 0)  # granted, spent
    assert found.last_top_up.top_up_id == "inv-2" and found.pending_units == 0

    seed(redis_client, PREFIX, ["tenant:acme"])
    store(redis_client, "tenant:acme", BalanceState(400, 150, 0, 0, 9))
    found = balance("tenant:acme", redis_client, PREFIX)
    assert found.source == "redis" and found.state[:2] == (400, 150)

    CreditAccount.objects.filter(ref="tenant:acme").update(granted=450)  # a top-up not applied
    assert balance("tenant:acme", redis_client, PREFIX).pending_units == 50
    with pytest.raises(CreditInputError):
        balance("acme", redis_client, PREFIX)
