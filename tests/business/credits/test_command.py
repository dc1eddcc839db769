"""``manage.py ratelimit credits top-up|show`` and the credits checkpoint that ``ratelimit
rollup`` runs after the usage rollup (management/commands/ratelimit.py)."""

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ratelimit_app.decision.balances import BalanceState, account_key
from ratelimit_app.models import CreditAccount, CreditTopUp

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: top-ups reach Redis at theirs


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command("ratelimit", *args, stdout=out, stderr=err)
    return out.getvalue()


def refused(*args):
    with pytest.raises(CommandError) as error:
        run(*args)
    return error.value


def test_top_up_credits_once_per_id_and_says_so(redis_client):
    out = run("credits", "top-up", "tenant:acme", "500", "--id", "inv-1", "--note", "March")
    assert out == "Credited 500 units to tenant:acme (tenant acme) (top-up inv-1); granted in " \
                  "all: 500 units.\n"
    assert BalanceState.unpack(redis_client.get(account_key("rl", "tenant:acme"))).granted == 500
    again = run("credits", "top-up", "tenant:acme", "500", "--id", "inv-1")
    assert again.startswith("Top-up inv-1 was made before (500 units to tenant:acme, 20")
    assert again.endswith("); nothing credited again.\n")
    made = CreditTopUp.objects.get()
    assert (made.actor, made.note) == ("manage.py ratelimit credits top-up", "March")

    conflict = refused("credits", "top-up", "tenant:acme", "499", "--id", "inv-1")
    assert conflict.returncode == 2 and "“inv-1” was used for 500 units" in str(conflict)
    for args, message in ((("tenant:acme", "ten"), "units must be a whole number"),
                          (("acme", "5"), "“acme” names no account"),
                          (("user:424242", "5"), "There is no user with id 424242")):
        error = refused("credits", "top-up", *args, "--id", "inv-2")
        assert error.returncode == 2 and message in str(error)
    assert CreditAccount.objects.get().granted == 500


def test_show_prints_the_balance_granted_spent_and_last_top_up(redis_client):
    run("credits", "top-up", "tenant:acme", "500", "--id", "inv-1", "--note", "March")
    redis_client.set(account_key("rl", "tenant:acme"),
                     BalanceState(500, 120, 3, 1_767_225_600_000, 9).pack())
    lines = run("credits", "show", "tenant:acme").splitlines()
    # no credits rule charges tenants: the allowance, and so the units left, are not known
    assert lines[:7] == ["tenant:acme (tenant acme)",
                         "allowance      unknown: no credits rule for tenants is in force",
                         "consumed       3 units in the period from 2026-01-01 00:00:00 UTC (the "
                         "allowance first, then prepaid units)",
                         "prepaid left   380 units", "units left     unknown, as the allowance is",
                         "granted        500 units", "spent          120 units (prepaid, in all)"]
    assert lines[7].startswith("last top-up    inv-1: 500 units, 20")
    assert lines[7].endswith(", by manage.py ratelimit credits top-up (March)")
    assert lines[8:] == ["checkpointed   never"]

    redis_client.delete(account_key("rl", "tenant:acme"))
    out = run("credits", "show", "tenant:acme")
    assert "prepaid left   500 units" in out
    assert "Redis holds no balance for it yet: these are the database's numbers" in out

    error = refused("credits", "show", "tenant:nobody")
    assert error.returncode == 2 and "tenant:nobody has no credit account" in str(error)


def test_show_and_top_up_when_redis_is_down(redis_server):
    run("credits", "top-up", "tenant:acme", "500", "--id", "inv-1")
    redis_server.kill()
    try:
        error = refused("credits", "show", "tenant:acme")
        assert error.returncode == 1 and "Redis is unavailable; the balance cannot be read" in \
            str(error)
        # the ledger has it; Redis is given it by the next checkpoint
        assert run("credits", "top-up", "tenant:acme", "100", "--id", "inv-2").startswith(
            "Credited 100 units")
    finally:
        redis_server.start()
    assert CreditAccount.objects.get().granted == 600


def test_rollup_checkpoints_the_credit_balances_after_the_usage(redis_client):
    assert run("rollup") == "Rolled up 0 batches into 0 usage records.\n"  # no accounts: quiet
    run("credits", "top-up", "tenant:acme", "500", "--id", "inv-1")
    run("credits", "top-up", "tenant:globex", "50", "--id", "inv-2")
    redis_client.set(account_key("rl", "tenant:acme"), BalanceState(500, 70, 0, 0, 5).pack())
    redis_client.delete(account_key("rl", "tenant:globex"))
    assert run("rollup").splitlines() == [
        "Rolled up 0 batches into 0 usage records.",
        "Checkpointed 2 credit balances; 1 set from the database (Redis had none)."]
    assert CreditAccount.objects.get(ref="tenant:acme").spent == 70
    assert run("rollup").splitlines()[1] == "Checkpointed 2 credit balances."
