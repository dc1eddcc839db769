"""A few config rows read by primary key, through a query the ORM builds once.

After an edit every worker reads the rows it named (``compiler.py``, and their digests,
``fingerprint.py``). Building such a query costs the ORM about ten times what the database
then takes to run it on one row, so each query is built once per model, columns and number of
rows, with stand-ins for the keys, and run again with the keys of each edit.
"""
import functools
import threading
from typing import NamedTuple

__all__ = ["rows_by_id", "with_keys"]


def with_keys(params, keys):
    """Return a query's ``params`` with its stand-ins for primary keys replaced: -1 to -n, for
    the n ``keys`` in ascending order (no primary key of a config table is negative, and a
    stand-in is a plain int, never a bool filter's value). A query that does not hold exactly
    those stand-ins (a database backend that passes the keys another way) is refused: it
    would read other rows than those asked for."""
    ordered = sorted(keys)
    stand_ins = [param for param in params if type(param) is int and param < 0]
    if sorted(stand_ins, reverse=True) != list(range(-1, -len(ordered) - 1, -1)):
        raise ValueError(f"the query's parameters {params!r} do not hold one stand-in for each "
                         f"of the {len(ordered)} keys")
    return tuple(ordered[-param - 1] if type(param) is int and param < 0 else param
                 for param in params)


def rows_by_id(model, fields, keys, **filters):
    """Return the rows of ``model`` whose primary key is among ``keys`` and that ``filters``
    keep, as named tuples of ``fields`` (in the model's default order, if it has one): what
    ``model.objects.filter(pk__in=keys, **filters).values_list(*fields, named=True)`` returns,
    the database's values converted as the ORM converts them."""
    from django.db import connections, router

    if not keys:
        return []
    using = router.db_for_read(model)
    query = _query(using, model, tuple(fields), tuple(sorted(filters.items())), len(keys),
                   threading.get_ident())
    with connections[using].cursor() as cursor:
        cursor.execute(query.sql, with_keys(query.params, keys))
        rows = cursor.fetchall()
    if query.converters:
        rows = query.compiler.apply_converters(rows, query.converters)
    new = tuple.__new__
    return [new(query.row, values) for values in rows]


class _Query(NamedTuple):
    """A compiled query of ``_query``: its SQL and params, and how its rows are converted."""

    sql: str
    params: tuple
    compiler: object
    converters: dict
    row: type


# (per thread: the ORM's converters belong to the connection of the thread that built the
# query; a process has few threads that compile, and the cache is bounded anyway)
@functools.lru_cache(maxsize=256)
def _query(using, model, fields, filters, count, thread):
    from django.db.models.utils import create_namedtuple_class

    queryset = model._default_manager.db_manager(using) \
        .filter(pk__in=range(-1, -count - 1, -1), **dict(filters)).values_list(*fields)
    compiler = queryset.query.get_compiler(using)
    sql, params = compiler.as_sql()
    columns = [selected[0] for selected in compiler.select[:compiler.col_count]]
    return _Query(sql, tuple(params), compiler, compiler.get_converters(columns),
                  create_namedtuple_class(*fields))
