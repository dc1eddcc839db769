"""The quota configuration: its rows, the snapshot the request path reads, and its versions.

``models`` (plans, rules, endpoint costs, API keys, dated overrides, the audit trail's entries),
``snapshot`` (the immutable snapshot the request path reads), ``compiler`` (rows → snapshot, in
proportion to what changed), ``fingerprint`` (a digest of the rows, to notice edits made
without a signal), ``policy`` (the snapshot in force, kept fresh by a watcher thread),
``versions`` (the config version in the store that every debit is fenced on),
``quotas_as_code`` (the rows as one JSON document), ``audit`` (who changed what, and restore),
``endpoints`` (the URLconf's endpoint names), ``commit_hooks`` (once per committed transaction),
``factors`` (an override's factor of a rule's numbers), ``override_words`` (an override in
words).
Layer: imports ``decision``, ``stores``, ``process`` and ``conf``; never ``metrics`` (a sibling)
or anything above.
"""
