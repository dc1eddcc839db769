"""Proxies of the alerts' models: their rows stay in ``ratelimit_app``'s tables."""

from ratelimit_app import models

from .. import proxy_meta


class QuotaAlert(models.QuotaAlert):
    Meta = proxy_meta(models.QuotaAlert)


class WebhookEndpoint(models.WebhookEndpoint):
    Meta = proxy_meta(models.WebhookEndpoint)


class WebhookDelivery(models.WebhookDelivery):
    Meta = proxy_meta(models.WebhookDelivery)
