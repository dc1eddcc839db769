"""commit_hooks.on_commit_once: once per committed transaction, on the real database (the
tests' transactions commit for real), savepoints included."""

import contextlib

import pytest
from django.db import transaction

from ratelimit_app.config.commit_hooks import on_commit_once

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def test_many_calls_in_one_transaction_run_once_per_kind_at_its_commit():
    ran = []
    with transaction.atomic():
        assert on_commit_once("bump", lambda: ran.append("bump"))
        for _ in range(5):
            assert not on_commit_once("bump", lambda: ran.append("bump"))
        assert on_commit_once("audit", lambda: ran.append("audit"))
        with transaction.atomic():  # a savepoint inside: still the same transaction
            assert not on_commit_once("bump", lambda: ran.append("bump"))
        assert ran == []
    assert sorted(ran) == ["audit", "bump"]


def test_each_transaction_runs_its_own_and_outside_one_it_runs_at_once():
    ran = []
    for _ in range(2):
        with transaction.atomic():
            on_commit_once("bump", lambda: ran.append("in a transaction"))
            on_commit_once("bump", lambda: ran.append("in a transaction"))
    on_commit_once("bump", lambda: ran.append("autocommit"))
    on_commit_once("bump", lambda: ran.append("autocommit"))
    assert ran == ["in a transaction"] * 2 + ["autocommit"] * 2


def test_a_rolled_back_transaction_runs_nothing():
    ran = []
    with contextlib.suppress(Boom), transaction.atomic():
        on_commit_once("bump", lambda: ran.append("bump"))
        raise Boom
    assert ran == []


def test_a_change_after_a_savepoint_rolled_back_registers_again():
    """The callback registered inside the savepoint went with it: the next change of the same
    transaction must register its own, or the committed change would go unannounced."""
    ran = []
    with transaction.atomic():
        with contextlib.suppress(Boom), transaction.atomic():
            assert on_commit_once("bump", lambda: ran.append("rolled back"))
            raise Boom
        assert on_commit_once("bump", lambda: ran.append("committed"))
        assert not on_commit_once("bump", lambda: ran.append("committed"))
    assert ran == ["committed"]
