"""The quota configuration: its rows, the snapshot the request path reads, and its versions.

``models`` (plans, rules, endpoint costs, API keys, dated overrides, the audit trail's entries),
``policy`` (the rows compiled into an immutable snapshot, kept fresh by a watcher thread),
``versions`` (the config version in the store that every debit is fenced on),
``quotas_as_code`` (the rows as one JSON document), ``audit`` (who changed what, and restore),
``endpoints`` (the URLconf's endpoint names), ``commit_hooks`` (once per committed transaction).
Layer: imports ``decision``, ``stores``, ``process`` and ``conf``; never ``metrics`` (a sibling)
or anything above.
"""
