"""What an edit changed, as a config version records it: tables, or rows of tables.

A publication names its changes as strings (``versions.ConfigVersions.publish``), each a
model name, meaning the whole table (its rows unknown), or a model name and a primary key,
``"rule:12"``, meaning that row: saved, created or deleted. Each worker then reads only the
rows named, and the whole tables named (``compiler.compile_snapshot``, and the digest of the
rows, ``fingerprint.config_fingerprint``): an edit of one rule costs one row's read, not the
table's.

A transaction that changes more than ``MAX_ROWS_NAMED`` rows of one table names the table
instead: the record of changes stays short, and reading such a table whole costs about as much.
"""

__all__ = ["add_row", "by_table", "row_change", "MAX_ROWS_NAMED"]

MAX_ROWS_NAMED = 100


def row_change(model_name, pk):
    """Return the change naming one row (``"rule:12"``)."""
    return f"{model_name}:{pk}"


def add_row(changes, model_name, pk):
    """Add the row ``pk`` of ``model_name`` to ``changes`` (a set, changed in place), or the
    whole table once it holds MAX_ROWS_NAMED rows of it (or the table already)."""
    if model_name in changes:
        return
    prefix = f"{model_name}:"
    if pk is None or sum(1 for change in changes if change.startswith(prefix)) \
            >= MAX_ROWS_NAMED:
        changes.difference_update([change for change in changes if change.startswith(prefix)])
        changes.add(model_name)
    else:
        changes.add(row_change(model_name, pk))


def by_table(changes):
    """Return ``changes`` (strings as above) as ``{model name: frozenset of primary keys, or
    None for the whole table}``. A key that is not an integer (every config table's is) reads
    its table whole."""
    rows = {}
    for change in changes:
        model_name, _, pk = change.partition(":")
        if not model_name:
            continue
        if not (pk.isascii() and pk.isdigit()) or rows.get(model_name, ()) is None:
            rows[model_name] = None
        else:
            rows.setdefault(model_name, set()).add(int(pk))
    return {name: None if pks is None else frozenset(pks) for name, pks in rows.items()}
