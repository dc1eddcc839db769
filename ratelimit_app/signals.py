"""Bump the config version in Redis after every committed change of a quota row.

Workers compare the version with their snapshot's and reload, so an admin edit is enforced
everywhere within about a second without a restart.
"""

import logging

from django.contrib.auth.signals import user_login_failed
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from . import guard, policy, storage
from .models import ApiKey, EndpointCost, IdentityOverride, Plan, PlanAssignment, Rule

logger = logging.getLogger("ratelimit_app")

WATCHED_MODELS = (Plan, PlanAssignment, ApiKey, Rule, EndpointCost, IdentityOverride)


def bump_config_version():
    """Tell every worker to reload (logged, not raised, if Redis is down: workers poll again).

    This process reloads at once; the others on the reply of their next Lua call.
    """
    policy.reset()
    try:
        storage.bump_config_version()
    except storage.StorageUnavailable as exc:
        logger.error("ratelimit_app: config change not announced, Redis unavailable: %s", exc)


def _on_change(sender, **kwargs):
    transaction.on_commit(bump_config_version)


for model in WATCHED_MODELS:
    post_save.connect(_on_change, sender=model, dispatch_uid=f"ratelimit_app.save.{model.__name__}")
    post_delete.connect(_on_change, sender=model, dispatch_uid=f"ratelimit_app.delete.{model.__name__}")


def _on_login_failed(sender, credentials=None, request=None, **kwargs):
    # Django's authenticate() (login forms, DRF's BasicAuthentication) reports wrong passwords
    # here; the failure is charged to the client IP once the response is ready (guard.py)
    guard.mark_authentication_failed(request)


user_login_failed.connect(_on_login_failed, dispatch_uid="ratelimit_app.login_failed")
