"""The process's Limiter and what connects it to Django.

``limiter`` composes the layers below into the request path (snapshot, identity, buckets, one
store call, metrics, alert crossings) and holds every piece of per-process state; ``guard`` is
the one entry point the adapters use (decide once, never fail); ``signals`` publishes a new
config version after each committed change of quota rows and charges failed logins. Layer:
imports ``business``, ``config``, ``metrics`` and below; the adapters, the views, the admin and the
operations tools import it.
"""
