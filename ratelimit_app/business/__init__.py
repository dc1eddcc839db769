"""The business features built on the decisions: quota alerts with signed webhooks (``alerts/``)
and usage records for billing (``usage/``).

None of it runs on the request path beyond what the Limiter hands it (a threshold crossing put on
a queue); the rest is background threads, commands and the database. Layer: imports ``config``,
``metrics`` and the layers below them; the runtime, the admin, the views and the operations tools
import it.
"""
