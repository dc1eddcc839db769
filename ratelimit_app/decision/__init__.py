"""The decision: what a request costs, which buckets it is charged on, and what the store's reply
means, with the per-process state that spares Redis calls.

Pure steps (``engine``, ``buckets``, ``periods``, ``identity``, ``headers``, ``header_fields``,
``keys``, ``scopes``) and the state a Limiter owns (``deny_cache``, ``leases``, ``breaker``,
``clock``). The token math that runs in Redis is in ``stores/lua/``; ``buckets`` encodes its
arguments and decodes its replies. Layer: imports ``conf``, ``process`` and ``stores`` only;
everything above may import it.
"""
