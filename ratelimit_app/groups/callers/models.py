"""Proxies of the callers' models: their rows stay in ``ratelimit_app``'s tables. (The allow
and deny lists moved to Protection, beside the penalty box.)"""

from ratelimit_app import models

from .. import proxy_meta


class ApiKey(models.ApiKey):
    Meta = proxy_meta(models.ApiKey)


class PlanAssignment(models.PlanAssignment):
    Meta = proxy_meta(models.PlanAssignment)


class IdentityOverride(models.IdentityOverride):
    Meta = proxy_meta(models.IdentityOverride)
