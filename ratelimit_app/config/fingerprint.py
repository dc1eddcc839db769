"""A digest of the quota rows, per part (table), to notice edits made without a signal.

The watcher compares it with its snapshot's every ``CONFIG_RELOAD_INTERVAL_S`` (one query, read
and hashed in chunks with pauses so that requests keep the GIL).
"""
import functools
import hashlib
import itertools
import marshal
import operator

from .compiler import FINGERPRINT_CHUNK_ROWS, config_models, pause

__all__ = ["config_fingerprint", "COMPARISON_PAUSE_S"]

# The watcher's comparison pauses this long after each chunk of rows, in which a request thread
# can take the GIL: with the bench's 1,954 rows a comparison lasts about 100 ms, for 12.6 ms of
# CPU against 7.3 ms in one go, and a request that gives the GIL up for a moment (each call to
# Redis) seldom finds it taken on return (docs/howto/apply-edits.md).
COMPARISON_PAUSE_S = 0.001


@functools.cache
def _fingerprint_query(using, vendor, parts):
    """Return the ``(sql, params)`` of ``config_fingerprint``'s query on database ``using``
    for the tables of ``parts`` (a tuple of model names).

    Built once per process: the ORM takes about 4 ms to build and compile it, ten times what
    SQLite then takes to run it on the demo's rows.
    """
    from django.db.models import TextField, Value
    from django.db.models.functions import Cast

    tables = [(model, model._meta.concrete_fields) for model in config_models()
              if model._meta.model_name in parts]
    width = 1 + max(len(columns) for _, columns in tables)
    names = [f"fingerprint_{i}" for i in range(width)]
    queries = []
    for model, columns in tables:
        values = [Value(model._meta.db_table, output_field=TextField())]
        values += [Cast(column.attname, TextField()) for column in columns]
        values += [Value(None, output_field=TextField())] * (width - len(values))
        queries.append(model._default_manager.db_manager(using).order_by()
                       .annotate(**dict(zip(names, values))).values_list(*names))
    union = (queries[0].union(*queries[1:], all=True) if len(queries) > 1 else queries[0]).query
    # no ORDER BY at all: the first model's Meta.ordering would otherwise order the union by a
    # column it does not select, which Django 6.1 refuses ("ORDER BY term does not match any
    # column"); ``order_by()`` clears only explicit orderings, not the model's default one
    union.clear_ordering(force=True, clear_default=True)
    return union.sql_with_params()


def config_fingerprint(pause_s=0.0, parts=None):
    """Return a digest of the rows of each config table, ``{model name: hex str}``, in one
    database query (``parts``: the model names of the tables to read; default: all).

    Any change to those rows changes it: a ``save()``, but also what sends no signal (a
    queryset's ``update()``, ``bulk_create``, a data migration, raw SQL) and a ``delete()`` of a
    queryset. Workers compare it with the one their snapshot was compiled at, once every
    ``CONFIG_RELOAD_INTERVAL_S`` (``PolicyCache``).

    Why a content digest: ``update()`` and raw SQL leave ``auto_now`` columns alone, and an edit
    that deletes one row and adds another keeps the row count, so neither a count nor a latest
    timestamp would notice them. Every column of each table is read, not only those the
    snapshot uses today: a column compile_snapshot starts reading is then covered without
    anyone having to remember this function (an edit of a column it does not read costs one
    needless reload). The tables are read in one ``UNION ALL`` of text columns (each value
    cast to text by the database, so a digest is comparable only with digests from the same
    database, which is all it is used for; narrower tables padded to the widest, the padding
    dropped again before hashing) and the rows sorted here, the order of a union being
    undefined. A table's digest is the same whichever other tables are read with it, so that
    the digest of a compile that read some tables again merges into the whole one.

    With ``pause_s`` (the comparison thread's), the rows are read and hashed
    ``FINGERPRINT_CHUNK_ROWS`` at a time, sleeping ``pause_s`` between chunks: the reading and
    hashing hold the GIL (about 7 ms with the bench's 1,954 rows), and a request waiting for it
    would otherwise wait up to the interpreter's switch interval (5 ms) at a time. With pauses,
    it waits for one chunk at most.
    """
    from django.db import connections, router, transaction

    # each table's model name and own width (its name, then its columns): the query pads
    # narrower tables to the widest it reads, which depends on the tables asked for, and a
    # table's digest must not
    tables = {model._meta.db_table: (model._meta.model_name, 1 + len(model._meta.concrete_fields))
              for model in config_models()}
    parts = tuple(sorted(name for name, _ in tables.values()) if parts is None else sorted(parts))
    if not parts:
        return {}
    using = router.db_for_read(config_models()[0])
    sql, params = _fingerprint_query(using, connections[using].vendor, parts)
    # in a savepoint: should the query fail inside a request's transaction (ATOMIC_REQUESTS), the
    # database (PostgreSQL) would otherwise refuse every later query of that request
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = []
        while chunk := cursor.fetchmany(FINGERPRINT_CHUNK_ROWS):
            rows += chunk
            if pause_s:
                pause(pause_s)
    # (table, primary key) is unique, so the sort never compares further columns (nor None
    # with text)
    rows.sort()
    # marshal's format 2 is exact (typed and length-prefixed: None apart from "") and has no
    # back-references, so equal rows give equal bytes; it is about 4x quicker than repr (0.7
    # vs 3.0 ms for the bench's 1,954 rows). Each chunk's bytes say where they end, so the
    # chunks' concatenation is as exact as the whole list's. Sorted, a table's rows are
    # contiguous: one digest per table, so a comparison says which tables changed.
    digests = {part: hashlib.blake2b(digest_size=16) for part in parts}
    for table, table_rows in itertools.groupby(rows, key=operator.itemgetter(0)):
        part, width = tables[table]
        digest, table_rows = digests[part], [row[:width] for row in table_rows]
        for start in range(0, len(table_rows), FINGERPRINT_CHUNK_ROWS):
            digest.update(marshal.dumps(table_rows[start:start + FINGERPRINT_CHUNK_ROWS], 2))
            if pause_s:
                pause(pause_s)
    return {part: digest.hexdigest() for part, digest in digests.items()}


