"""The operators' tools: Django system checks (``system_checks``), ``manage.py ratelimit check``
(``readiness``), one real decision against the store (``round_trip``), and the library versions
the app is known to work with (``support``).

The commands themselves are in ``management/commands/`` (where Django finds them). Layer: beside
the admin and the views; imports the runtime and below.
"""
