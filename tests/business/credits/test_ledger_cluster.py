"""The ledger of prepaid credits on the session's real 3-master Redis Cluster, through the
Limiter's own cluster client: seeds, top-ups and checkpoints of balances on three masters, and
a failover to a replica that missed the last writes (the checkpoint gives it back the state it
lost)."""

import signal

import pytest
from redis.exceptions import RedisClusterException, RedisError

from ratelimit_app.business.credits.ledger import checkpoint, seed, top_up
from ratelimit_app.decision.balances import BalanceState, account_key
from ratelimit_app.models import CreditAccount

from ...helpers import limiter, poll_until

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

PREFIX = "rl"


def tenants_on_each_master(cluster):
    """One tenant account per master (in the masters' order) whose balance lives on it."""
    by_port = {}
    for n in range(200):
        ref = f"tenant:t{n}"
        by_port.setdefault(cluster.master_of(account_key(PREFIX, ref)).port, ref)
        if len(by_port) == len(cluster.masters()):
            return [by_port[master.port] for master in cluster.masters()]
    raise AssertionError("no tenant for some master")


def on_master(cluster, ref):
    """The BalanceState the master serving ``ref``'s balance holds (read on that node)."""
    with cluster.master_of(account_key(PREFIX, ref)).client() as client:
        return BalanceState.unpack(client.get(account_key(PREFIX, ref)))


def row(ref):
    account = CreditAccount.objects.get(ref=ref)
    return BalanceState(account.granted, account.spent, account.used, account.period_start_ms,
                        account.seq)


def replica_of(cluster, master):
    """The RedisServer replicating ``master``."""
    view = cluster.cluster_view()
    master_id = next(entry["id"] for entry in view if entry["port"] == master.port)
    return cluster.node_at(next(entry["port"] for entry in view
                                if entry["master_id"] == master_id))


def test_seed_top_up_and_checkpoint_on_three_masters(cluster,
                                                     django_capture_on_commit_callbacks):
    client = limiter().store.metrics_client()  # the RedisCluster the commands use
    refs = tenants_on_each_master(cluster)
    for n, ref in enumerate(refs):
        CreditAccount.objects.create(ref=ref, granted=100 * (n + 1), spent=n, seq=n)
    assert seed(client, PREFIX, refs) == 3  # one pipeline, a command per master
    assert [on_master(cluster, ref) for ref in refs] == [
        BalanceState(100, 0, 0, 0, 0), BalanceState(200, 1, 0, 0, 1),
        BalanceState(300, 2, 0, 0, 2)]

    with django_capture_on_commit_callbacks(execute=True):
        for ref in refs:
            top_up(ref, 50, f"inv-{ref}", actor="test", client=client, prefix=PREFIX)
    assert [on_master(cluster, ref).granted for ref in refs] == [150, 250, 350]

    # what the request path would have left, then Redis losing some of it
    first, second, third = refs
    with cluster.master_of(account_key(PREFIX, second)).client() as node:
        node.set(account_key(PREFIX, second), BalanceState(250, 90, 0, 0, 30).pack())
    assert checkpoint(client, PREFIX) == (3, 0, 0, 0)
    assert row(second) == BalanceState(250, 90, 0, 0, 30)
    with cluster.master_of(account_key(PREFIX, first)).client() as node:
        node.delete(account_key(PREFIX, first))
    with cluster.master_of(account_key(PREFIX, second)).client() as node:
        node.set(account_key(PREFIX, second), BalanceState(250, 10, 0, 0, 12).pack())
    CreditAccount.objects.filter(ref=third).update(granted=1000)  # a top-up not applied
    assert checkpoint(client, PREFIX) == (3, 1, 1, 1)
    assert [on_master(cluster, ref) for ref in refs] == [
        BalanceState(150, 0, 0, 0, 1), BalanceState(250, 90, 0, 0, 30),
        BalanceState(1000, 2, 0, 0, 4)]


def test_a_failover_to_a_replica_that_missed_writes_is_given_back_the_checkpoint(cluster):
    client = limiter().store.metrics_client()
    ref = "tenant:failover"
    key = account_key(PREFIX, ref)
    CreditAccount.objects.create(ref=ref, granted=1000)
    seed(client, PREFIX, [ref])
    master = cluster.master_of(key)
    replica = replica_of(cluster, master)
    with master.client() as node:
        node.set(key, BalanceState(1000, 200, 0, 0, 20).pack())
        assert node.execute_command("WAIT", 1, 5000) == 1  # the replica has seq 20
        # the replica misses what follows: stopped, and its link closed by the master (what
        # the master had sent before stays in the socket, so stopping it alone is not enough)
        replica.process.send_signal(signal.SIGSTOP)
        try:
            node.execute_command("CLIENT", "KILL", "TYPE", "replica")
            node.set(key, BalanceState(1000, 700, 0, 0, 70).pack())
            assert checkpoint(client, PREFIX) == (1, 0, 0, 0)  # the row: spent 700, seq 70
            master.kill()
        finally:
            replica.process.send_signal(signal.SIGCONT)
    try:
        cluster.wait_for_promotion(key, master)
        assert cluster.master_of(key).port == replica.port
        with replica.client() as node:
            assert BalanceState.unpack(node.get(key)) == BalanceState(1000, 200, 0, 0, 20)

        results = []

        def checkpointed():
            try:
                results.append(checkpoint(client, PREFIX))
            except (RedisError, RedisClusterException):  # the client learning the new master
                return False
            return True

        poll_until(checkpointed, timeout_s=20, what="a checkpoint on the promoted replica")
        assert results == [(1, 0, 1, 0)]  # restored: 500 units spent are not given back
        with replica.client() as node:
            assert BalanceState.unpack(node.get(key)) == BalanceState(1000, 700, 0, 0, 70)
    finally:
        cluster.restart_node(master)
