"""Work to do once per committed transaction, however many rows it changed.

A quota row's ``post_save`` / ``post_delete`` asks for an audit entry and a config-version bump
at the commit of its transaction. An admin save with its inlines, ``manage.py loaddata`` of a
fixture (one transaction, a raw ``post_save`` per row) or an import changes many rows in one
transaction, and each piece of that work must run once for all of them, not once per row.

Django has no "after this transaction" signal and no post-loaddata signal, but it keeps the
callbacks waiting for the commit on the connection (``run_on_commit``: (savepoint ids, callback,
robust) each), and drops from it the callbacks of a savepoint that rolls back. So looking there
for a callback of the same kind is exact: registered once per transaction, and registered again
by the next change after a rollback to a savepoint took the first one away.
"""

import functools

from django.db import transaction

__all__ = ["on_commit_once", "waiting_for_commit"]


def waiting_for_commit(kind, using=None):
    """Return the callback of ``kind`` that waits for the commit of the transaction around this
    call (as given to ``on_commit_once``), or None."""
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        return None
    for entry in connection.run_on_commit:
        if getattr(entry[1], "ratelimit_commit_kind", None) == kind:
            return entry[1].func
    return None


def on_commit_once(kind, callback, using=None):
    """Run ``callback()`` when the transaction around this call commits (at once outside a
    transaction), unless a callback of the same ``kind`` (a string) already waits for that
    commit. Returns True if ``callback`` was registered."""
    if waiting_for_commit(kind, using) is not None:
        return False
    tagged = functools.partial(callback)  # a function of its own to carry the tag
    tagged.ratelimit_commit_kind = kind
    transaction.on_commit(tagged, using=using)
    return True
