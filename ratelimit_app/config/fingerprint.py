"""A digest of the quota rows, row by row, to notice edits made without a signal.

The watcher compares it with its snapshot's every ``CONFIG_RELOAD_INTERVAL_S`` (one query, read
and hashed in chunks with pauses so that requests keep the GIL); a compile after an edit reads
again only the rows the edit named, and patches their digests in (``changes.py``).
"""
import functools

from .changes import MAX_ROWS_NAMED, by_table, row_change
from .compiler import FINGERPRINT_CHUNK_ROWS, config_models, pause
from .row_queries import with_keys

__all__ = ["config_fingerprint", "changed_rows", "COMPARISON_PAUSE_S"]

# The watcher's comparison pauses this long after each chunk of rows, in which a request thread
# can take the GIL: with the bench's 1,954 rows a comparison lasts about 100 ms, for 12.6 ms of
# CPU against 7.3 ms in one go, and a request that gives the GIL up for a moment (each call to
# Redis) seldom finds it taken on return (docs/howto/apply-edits.md).
COMPARISON_PAUSE_S = 0.001


def _text_columns(model, width):
    """The annotations of a fingerprint query of ``model``: its table's name, then each column
    cast to text by the database, padded with NULLs to ``width`` values; and their names."""
    from django.db.models import TextField, Value
    from django.db.models.functions import Cast

    values = [Value(model._meta.db_table, output_field=TextField())]
    values += [Cast(column.attname, TextField()) for column in model._meta.concrete_fields]
    values += [Value(None, output_field=TextField())] * (width - len(values))
    names = [f"fingerprint_{i}" for i in range(width)]
    return dict(zip(names, values)), names


@functools.cache
def _fingerprint_query(using, vendor, parts):
    """Return the ``(sql, params)`` of ``config_fingerprint``'s query on database ``using``
    for the tables of ``parts`` (a tuple of model names).

    Built once per process: the ORM takes about 4 ms to build and compile it, ten times what
    SQLite then takes to run it on the demo's rows.
    """
    tables = [model for model in config_models() if model._meta.model_name in parts]
    width = 1 + max(len(model._meta.concrete_fields) for model in tables)
    queries = []
    for model in tables:
        columns, names = _text_columns(model, width)
        queries.append(model._default_manager.db_manager(using).order_by()
                       .annotate(**columns).values_list(*names))
    union = (queries[0].union(*queries[1:], all=True) if len(queries) > 1 else queries[0]).query
    # no ORDER BY at all: the first model's Meta.ordering would otherwise order the union by a
    # column it does not select, which Django 6.1 refuses ("ORDER BY term does not match any
    # column"); ``order_by()`` clears only explicit orderings, not the model's default one
    union.clear_ordering(force=True, clear_default=True)
    return union.sql_with_params()


def config_fingerprint(pause_s=0.0, parts=None, base=None):
    """Return a digest of the rows of each config table, ``{model name: {primary key: hash}}``
    (``parts``: the changes to read, model names or rows as ``changes.py`` writes them;
    default: every table): one database query for the tables read whole, and one per table of
    which rows are read (see ``base``).

    Any change to those rows changes it: a ``save()``, but also what sends no signal (a
    queryset's ``update()``, ``bulk_create``, a data migration, raw SQL) and a ``delete()`` of a
    queryset. Workers compare it with the one their snapshot was compiled at, once every
    ``CONFIG_RELOAD_INTERVAL_S`` (``PolicyCache``), and ``changed_rows`` says which rows
    differ.

    Why a content digest: ``update()`` and raw SQL leave ``auto_now`` columns alone, and an edit
    that deletes one row and adds another keeps the row count, so neither a count nor a latest
    timestamp would notice them. Every column of each table is read, not only those the
    snapshot uses today: a column compile_snapshot starts reading is then covered without
    anyone having to remember this function (an edit of a column it does not read costs one
    needless reload). The tables are read in one ``UNION ALL`` of text columns (each value
    cast to text by the database; narrower tables padded to the widest, the padding dropped
    again before hashing, so a table's digest is the same whichever tables are read with it).
    Each row is hashed on its own with Python's ``hash`` of the tuple (SipHash of each text,
    keyed per process: 64 bits, and digests are only ever compared within the process that
    made them), so a digest can be patched row by row: with ``base`` (a digest made earlier),
    the rows ``parts`` names are read (one query per table, by primary key) and patched into
    ``base``'s tables, a deleted row dropping out; a table ``parts`` names is read whole.

    With ``pause_s`` (the comparison thread's), the rows are read and hashed
    ``FINGERPRINT_CHUNK_ROWS`` at a time, sleeping ``pause_s`` between chunks: the reading and
    hashing hold the GIL, and a request waiting for it would otherwise wait up to the
    interpreter's switch interval (5 ms) at a time. With pauses, it waits for one chunk at most.
    """
    from django.db import connections, router, transaction

    names = {model._meta.model_name for model in config_models()}
    wanted = dict.fromkeys(names) if parts is None else \
        {name: rows for name, rows in by_table(parts).items() if name in names}
    whole = tuple(sorted(name for name, rows in wanted.items()
                         if rows is None or not isinstance(base, dict) or name not in base))
    if not wanted:
        return {}
    using = router.db_for_read(config_models()[0])
    digests = {name: {} for name in whole}
    # in a savepoint: should a query fail inside a request's transaction (ATOMIC_REQUESTS), the
    # database (PostgreSQL) would otherwise refuse every later query of that request
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        if whole:
            cursor.execute(*_fingerprint_query(using, connections[using].vendor, whole))
            _hash_rows(cursor, digests, pause_s)
        for name, rows in wanted.items():
            if name not in digests:
                found = {name: {}}
                cursor.execute(*_rows_query(using, name, rows))
                _hash_rows(cursor, found, pause_s)
                digests[name] = _patched(base[name], rows, found[name])
    return digests


def _hash_rows(cursor, digests, pause_s):
    """Hash each row the cursor reads into ``digests[model name][primary key]``."""
    tables = _table_layouts()
    while chunk := cursor.fetchmany(FINGERPRINT_CHUNK_ROWS):
        for row in chunk:
            name, width, pk_at = tables[row[0]]
            digests[name][int(row[pk_at])] = hash(row[:width])
        if pause_s:
            pause(pause_s)


@functools.cache
def _table_layouts():
    """``{table: (model name, width, position of the primary key)}`` of each config table's
    rows in a fingerprint query (its name, then its columns: the query pads narrower tables to
    the widest it reads, which depends on the tables asked for, and a table's digest must
    not)."""
    return {model._meta.db_table: (model._meta.model_name, 1 + len(model._meta.concrete_fields),
                                   1 + model._meta.concrete_fields.index(model._meta.pk))
            for model in config_models()}


def _rows_query(using, name, pks):
    """Return the ``(sql, params)`` reading the rows ``pks`` of model ``name`` as
    ``_fingerprint_query`` reads them."""
    from django.db import connections

    sql, params = _rows_query_template(using, connections[using].vendor, name, len(pks))
    return sql, with_keys(params, pks)


@functools.lru_cache(maxsize=64)
def _rows_query_template(using, vendor, name, count):
    """``_rows_query``'s SQL for ``count`` rows, built once, with stand-ins for the primary keys
    (see ``row_queries.with_keys``). Building it takes the ORM about 4 ms; reading a row by its
    key, a tenth of that."""
    model = next(model for model in config_models() if model._meta.model_name == name)
    columns, names = _text_columns(model, 1 + len(model._meta.concrete_fields))
    query = model._default_manager.db_manager(using).filter(pk__in=range(-1, -count - 1, -1)) \
        .order_by().annotate(**columns).values_list(*names).query
    query.clear_ordering(force=True, clear_default=True)
    return query.sql_with_params()


def _patched(table, pks, found):
    """Return a copy of a table's digest with the rows ``pks`` replaced by ``found``."""
    table = dict(table)
    for pk in pks:
        table.pop(pk, None)
    table.update(found)
    return table


def changed_rows(expected, found):
    """Return the changes between two digests, as ``changes.py`` writes them (the rows that
    differ, appeared or disappeared; the table when more than MAX_ROWS_NAMED did), or None
    when they cannot be compared table by table."""
    if not (isinstance(expected, dict) and isinstance(found, dict)):
        return None
    changes = set()
    for name in expected.keys() | found.keys():
        before, after = expected.get(name), found.get(name)
        if before == after:
            continue
        if not (isinstance(before, dict) and isinstance(after, dict)):
            changes.add(name)
            continue
        rows = {pk for pk in before.keys() | after.keys() if before.get(pk) != after.get(pk)}
        if len(rows) > MAX_ROWS_NAMED:
            changes.add(name)
        else:
            changes.update(row_change(name, pk) for pk in rows)
    return changes
