"""Usage records for billing: the rows (``models``), rolled up from the counts the metrics flush to
Redis (``rollup``), and read per day or month as rows, CSV or JSON (``records``).

The in-process counting and its exactly-once flush are in ``metrics/usage.py`` and
``metrics/usage_batches.py``: they run with every metrics flush.
"""
