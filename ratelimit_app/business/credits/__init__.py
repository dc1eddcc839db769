"""Prepaid credits: the account and top-up rows (``models``), the ledger that credits top-ups
once and keeps the balances in Redis in step with the database (``ledger``: top_up, seed,
checkpoint, balance), its Lua scripts (``scripts``), its checks of what it is given
(``refs``), which credits rule charges an account (``rules``) and a balance's figures as every
read path shows them (``figures``: the allowance used, the period's consumption, the units
left).

The balance itself, and what debits it, belong to the request path (decision/balances.py,
stores/lua/take.lua): a ``credits`` rule charges the caller's balance in the decision's one
atomic call; when the balance is missing there, the Limiter calls ``ledger.seed``.
"""
