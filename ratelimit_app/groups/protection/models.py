"""Proxies of the protection's models: their rows stay in ``ratelimit_app``'s tables."""

from ratelimit_app import models

from .. import proxy_meta


class BanRule(models.BanRule):
    Meta = proxy_meta(models.BanRule)


class Ban(models.Ban):
    Meta = proxy_meta(models.Ban)


class BanLogEntry(models.BanLogEntry):
    Meta = proxy_meta(models.BanLogEntry)


class AccessListEntry(models.AccessListEntry):
    Meta = proxy_meta(models.AccessListEntry)
