"""The levels of the bucket hierarchy (``Scope``), and the digest an API key is known by.

The request path names a caller at each level (identity.py) and the configuration's rows name
the level a rule counts at (config/models.py): both take the words from here.
"""

import hashlib

from django.db import models

__all__ = ["Scope", "hash_api_key"]


class Scope(models.TextChoices):
    GLOBAL = "global", "Global (all clients together)"
    PLAN = "plan", "Plan (all clients of the plan together)"
    TENANT = "tenant", "Tenant (each organisation)"
    USER = "user", "User or API key (each signed-in caller)"
    IP = "ip", "Client IP (each address)"


def hash_api_key(raw_key):
    """Return the stored digest of an API key (keys themselves are never stored)."""
    return hashlib.sha256(raw_key.encode("utf-8", "surrogateescape")).hexdigest()
