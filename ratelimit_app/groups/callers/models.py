"""Proxies of the callers' models: their rows stay in ``ratelimit_app``'s tables."""

from ratelimit_app import models

from .. import proxy_meta


class ApiKey(models.ApiKey):
    Meta = proxy_meta(models.ApiKey)


class PlanAssignment(models.PlanAssignment):
    Meta = proxy_meta(models.PlanAssignment)


class IdentityOverride(models.IdentityOverride):
    Meta = proxy_meta(models.IdentityOverride)


class AccessListEntry(models.AccessListEntry):
    Meta = proxy_meta(models.AccessListEntry)
