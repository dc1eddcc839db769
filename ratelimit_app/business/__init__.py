"""The business features built on the decisions: quota alerts with signed webhooks (``alerts/``),
usage records for billing (``usage/``) and the ledger of prepaid credits (``credits/``).

None of it runs on the request path beyond what the Limiter hands it (a threshold crossing put on
a queue) and the seed of a credit balance Redis does not hold (``credits.ledger.seed``); the
rest is background threads, commands and the database. Layer: imports ``config``, ``metrics``
and the layers below them; the runtime, the admin, the views and the operations tools import
it.
"""
