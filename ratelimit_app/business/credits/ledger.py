"""The ledger of prepaid credits: top-ups into the database, the balances in Redis kept in step.

Where the truth lives. The request path debits a balance in Redis, in the decision's one atomic
call (decision/balances.py): what an account has spent is known there only. What it has been
granted is known in the database: a ``CreditTopUp`` row per top-up (its id unique: sent again,
it credits nothing again) and their sum on the ``CreditAccount`` row, raised in the same
transaction. Redis is told after the commit (``top_up``), and told again by every checkpoint.

Why Redis losing a balance costs little. ``checkpoint`` (run by ``manage.py ratelimit rollup``
after each usage rollup) copies every balance's state into its account row. A balance Redis
lost (a flush, a failover to a replica that missed writes, a restore) is rebuilt from that row:
by ``seed`` when the request path finds it missing, or by the next checkpoint when Redis holds
an older one (its ``seq``, raised by every write, below the row's). Either way the account gets
back at most what it consumed since the last checkpoint, and never loses a top-up: the row's
``granted`` is the ledger's own total.
"""

import datetime
import functools
import logging
from collections import Counter
from typing import NamedTuple

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ...conf import get_config
from ...decision.balances import BalanceState, account_key
from ...stores.base import READ_ERRORS
from ..alerts.crossings import store_crossings
from . import scripts
from .alerts import credit_crossings
from .figures import CreditFigures
from .models import CreditAccount, CreditTopUp
from .refs import (
    CreditInputError,
    display_of,
    parse_note,
    parse_ref,
    parse_top_up_id,
    parse_units,
)
from .rules import AccountRules

__all__ = ["TopUpConflict", "top_up", "seed", "checkpoint", "CheckpointResult", "Balance",
           "balance", "last_top_up", "stored_states", "client_of", "state_of"]

logger = logging.getLogger("ratelimit_app")

# Accounts read (and checkpointed) per database query.
CHECKPOINT_BATCH = 500


class TopUpConflict(ValueError):
    """A top-up id already used for another account or another number of units."""


def client_of(store):
    """Return the redis-py client of ``store`` (a Limiter's store) for the ledger's calls, or
    None when it cannot be had now (Redis down: top-ups are applied by the next checkpoint)."""
    try:
        return store.metrics_client()
    except READ_ERRORS as exc:
        logger.warning("ratelimit_app: no Redis client for the credits ledger (%s)", exc)
        return None


def state_of(account):
    """Return the BalanceState an account row holds (the ledger's granted, the checkpoint)."""
    return BalanceState(account.granted, account.spent, account.used, account.period_start_ms,
                        account.seq)


# --- top-ups -------------------------------------------------------------------------------

def top_up(ref, units, top_up_id, *, actor, note="", client=None, prefix=None):
    """Credit ``units`` to the account ``ref`` once per ``top_up_id``; return ``(CreditTopUp,
    created)``.

    The top-up's ``account`` holds the new total. ``created`` is False when a top-up with this
    id was made before (by this call retried, in any thread or process) for the same account
    and units: nothing is credited again. TopUpConflict when the id was used for another
    account or units; CreditInputError for bad input (an account that names no existing API key
    or user included).

    After the commit the new total is applied to the balance in Redis through ``client`` (a
    redis-py client: ``client_of(limiter.store)``); a Redis error there is logged, and the next
    checkpoint applies it. Without a client, only the checkpoint does.
    """
    ref = parse_ref(ref)
    units = parse_units(units)
    top_up_id = parse_top_up_id(top_up_id)
    note = parse_note(note)
    done = _done_before(top_up_id, ref, units)
    if done is not None:
        return done, False
    account = _account(ref, must_exist=True)
    try:
        with transaction.atomic():
            # first: a concurrent top-up with the same id waits here (PostgreSQL) and fails
            made = CreditTopUp.objects.create(account=account, top_up_id=top_up_id, units=units,
                                              actor=str(actor)[:150], note=note)
            CreditAccount.objects.filter(pk=account.pk).update(granted=F("granted") + units)
            account.refresh_from_db(fields=["granted"])  # the new total, for the caller
    except IntegrityError:
        done = _done_before(top_up_id, ref, units)
        if done is None:
            raise
        return done, False
    if client is not None:
        apply = functools.partial(_apply_top_up, client, prefix or get_config()["KEY_PREFIX"],
                                  account.pk)
        transaction.on_commit(apply, robust=True)
    return made, True


def _done_before(top_up_id, ref, units):
    """Return the top-up made before with ``top_up_id`` (None if there is none); TopUpConflict
    if it was for another account or number of units."""
    done = CreditTopUp.objects.select_related("account").filter(top_up_id=top_up_id).first()
    if done is not None and (done.account.ref != ref or done.units != units):
        raise TopUpConflict(
            f"Top-up id “{top_up_id}” was used for {done.units} units to {done.account.ref}; "
            f"this top-up is {units} units to {ref}. Give a new top-up a new id.")
    return done


def _account(ref, *, must_exist=False):
    """Return the CreditAccount of ``ref``, created if there is none (with ``must_exist``,
    CreditInputError when ``ref`` names an API key or user that does not exist)."""
    account = CreditAccount.objects.filter(ref=ref).first()
    if account is not None:
        return account
    display = display_of(ref)
    if display is None and must_exist:
        kind = "API key" if ref.startswith("key:") else "user"
        raise CreditInputError(f"There is no {kind} with id {ref.partition(':')[2]} "
                               f"(the account {ref}).")
    account, _ = CreditAccount.objects.get_or_create(ref=ref, defaults={"display": display or ""})
    return account


def _apply_top_up(client, prefix, account_pk):
    """Raise the balance in Redis to the account's granted (after a top-up's commit)."""
    account = CreditAccount.objects.get(pk=account_pk)
    apply = client.register_script(scripts.APPLY_TOP_UP)
    try:
        apply(keys=[account_key(prefix, account.ref)], args=[state_of(account).pack()])
    except READ_ERRORS as exc:
        logger.warning("ratelimit_app: the top-up of %s is not in Redis yet (%s); the next "
                       "checkpoint (manage.py ratelimit rollup) applies it", account.ref, exc)


# --- the request path's seed ---------------------------------------------------------------

def seed(client, prefix, refs):
    """Put the balances of the accounts ``refs`` (``key:12``, ...) into Redis where they are
    missing, each from its account row (created, empty, if there is none); return how many
    were set.

    For the request path, when take.lua finds a balance missing (first use, or Redis lost it):
    one database query for the refs (and one insert per new account), then one pipeline of
    ``SET NX`` (a balance set meanwhile, by another worker or a top-up, is kept). Raises what
    Redis or the database raise. Synchronous (the ORM): call it through ``sync_to_async`` in
    async code.
    """
    refs = {parse_ref(ref) for ref in refs}
    if not refs:
        return 0
    accounts = {a.ref: a for a in CreditAccount.objects.filter(ref__in=refs)}
    for ref in sorted(refs - accounts.keys()):
        accounts[ref] = _account(ref)
    pipe = client.pipeline(transaction=False)
    for ref, account in sorted(accounts.items()):
        pipe.set(account_key(prefix, ref), state_of(account).pack(), nx=True)
    return sum(bool(done) for done in pipe.execute())


# --- checkpoints ---------------------------------------------------------------------------

class CheckpointResult(NamedTuple):
    """What one checkpoint did: accounts checkpointed, balances set from the database because
    Redis had none (``seeded``) or held an older state (``restored``), balances whose granted
    was raised to the ledger's (a top-up not applied before)."""

    accounts: int
    seeded: int
    restored: int
    raised: int


def checkpoint(client, prefix=None, snapshot=None):
    """Checkpoint every account's balance: one script call per account on its key (see
    scripts.CHECKPOINT: a missing balance is set from the row, an older one restored, a granted
    below the ledger's raised), and the balance's state written back into the row. With
    ``snapshot`` (the policy in force), the alert thresholds of its credits rules are compared
    with each balance (alerts.py). Returns a CheckpointResult. Raises what Redis raises (the
    accounts done so far stay done)."""
    prefix = prefix or get_config()["KEY_PREFIX"]
    run = client.register_script(scripts.CHECKPOINT)
    rules = AccountRules(snapshot) if snapshot is not None else None
    outcomes = Counter()
    last_pk = 0
    while True:
        batch = list(CreditAccount.objects.filter(pk__gt=last_pk).order_by("pk")
                     [:CHECKPOINT_BATCH])
        if not batch:
            break
        last_pk = batch[-1].pk
        now = timezone.now()
        unchanged, found = [], []
        for account in batch:
            row = state_of(account)
            outcome, *numbers = run(keys=[account_key(prefix, account.ref)], args=[row.pack()])
            stored = BalanceState(*(int(n) for n in numbers))
            outcomes[int(outcome)] += 1
            if outcome == scripts.RESTORED:
                logger.warning("ratelimit_app: Redis held an older balance of %s than the "
                               "checkpoint (seq %s; it lost writes): set back to the checkpoint",
                               account.ref, row.seq)
            if stored[1:] == row[1:]:
                unchanged.append(account.pk)
            else:
                _write_back(account.pk, stored, now)
            if rules is not None and rules.alerting:
                found.extend(_crossings(account, stored, rules, prefix))
        CreditAccount.objects.filter(pk__in=unchanged).update(checkpointed_at=now)
        if found:
            store_crossings(_not_stored_yet(found))
            found.clear()
    return CheckpointResult(sum(outcomes.values()), outcomes[scripts.SEEDED],
                            outcomes[scripts.RESTORED], outcomes[scripts.RAISED])


def _crossings(account, stored, rules, prefix):
    """The alert thresholds the account's balance ``stored`` has reached (alerts.py)."""
    rule = rules.rule_for(account.ref)
    if rule is None or not rule.alerts:
        return ()
    return credit_crossings(account, stored, last_top_up(account), rule, prefix)


def _not_stored_yet(found):
    """Return the Crossings of ``found`` with no QuotaAlert row yet: a balance stays past its
    thresholds round after round, and each would otherwise be refused by the row's unique
    constraint again."""
    from ..alerts.models import QuotaAlert

    stored = set(QuotaAlert.objects.filter(
        identity_key__in={c.identity_key for c in found}).values_list(
        "rule_id", "identity_key", "threshold", "period_start"))
    return [c for c in found
            if (c.rule_id, c.identity_key, c.threshold, _moment(c.period_start_ms)) not in stored]


def _moment(ms):
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def _write_back(pk, stored, now):
    # never granted (the ledger's own total); never an older state over a newer one (two
    # checkpoints at once)
    CreditAccount.objects.filter(pk=pk, seq__lte=stored.seq).update(
        spent=stored.spent, used=stored.used, period_start_ms=stored.period_start_ms,
        seq=stored.seq, checkpointed_at=now)


# --- reading a balance ---------------------------------------------------------------------

class Balance(NamedTuple):
    """An account's balance for display. ``state`` is Redis's (``source`` "redis"), or the
    account row's when Redis holds none yet ("checkpoint"); ``account.granted``, the sum of the
    top-ups, is ahead of ``state.granted`` while a top-up waits for the next checkpoint."""

    account: CreditAccount
    state: BalanceState
    source: str
    last_top_up: CreditTopUp | None

    def figures(self, rules, now_ms=None):
        """Return the CreditFigures of this balance (allowance used, prepaid left, units left,
        ...) under ``rules``, an AccountRules of the rules in force."""
        return CreditFigures.of_account(rules, self.account.ref, self.state, now_ms)

    @property
    def pending_units(self):
        """Units of top-ups not in Redis yet (applied by the next checkpoint)."""
        return max(0, self.account.granted - self.state.granted)


def last_top_up(account):
    """Return the account's (a CreditAccount, or its ref) latest CreditTopUp, or None."""
    top_ups = account.top_ups if isinstance(account, CreditAccount) else \
        CreditTopUp.objects.filter(account__ref=account)
    return top_ups.order_by("-created", "-id").first()


def stored_states(client, prefix, refs):
    """Return ``{ref: BalanceState or None}`` of the balances Redis holds (one pipeline)."""
    refs = list(refs)
    pipe = client.pipeline(transaction=False)
    for ref in refs:
        pipe.get(account_key(prefix, ref))
    return {ref: BalanceState.unpack(value) for ref, value in zip(refs, pipe.execute())}


def balance(ref, client, prefix=None):
    """Return the Balance of the account ``ref``, or None if it has no account yet (no top-up,
    never charged). CreditInputError if ``ref`` names no account; raises what Redis raises."""
    ref = parse_ref(ref)
    account = CreditAccount.objects.filter(ref=ref).first()
    if account is None:
        return None
    stored = stored_states(client, prefix or get_config()["KEY_PREFIX"], [ref])[ref]
    last = last_top_up(account)
    if stored is None:
        return Balance(account, state_of(account), "checkpoint", last)
    return Balance(account, stored, "redis", last)
