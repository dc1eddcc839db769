"""Proxies of the billing models: their rows stay in ``ratelimit_app``'s tables."""

from ratelimit_app import models

from .. import proxy_meta


class CreditAccount(models.CreditAccount):
    Meta = proxy_meta(models.CreditAccount)


class CreditTopUp(models.CreditTopUp):
    Meta = proxy_meta(models.CreditTopUp)


class UsageRecord(models.UsageRecord):
    Meta = proxy_meta(models.UsageRecord)
