"""The rows of quota alerts and their webhooks (re-exported by ``ratelimit_app.models``).

``QuotaAlert`` is the record of one threshold crossing: its unique constraint on (rule, identity
key, threshold, period start) is what makes an alert happen once however many worker processes
saw it (each inserts, the database keeps one). ``WebhookDelivery`` is the outbox: one row per
alert and subscribed endpoint, written in the same transaction as the alert, sent later by
``manage.py ratelimit deliver`` (webhooks.py). Nothing here is read on the request path.
"""

from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models

from ...conf import get_config
from .destinations import url_problem
from .signing import new_secret

__all__ = ["Event", "WebhookEndpoint", "QuotaAlert", "WebhookDelivery", "DeliveryStatus",
           "SignatureScheme", "new_webhook_secret", "EVERY_ADDRESS_KEY", "TOP_CALLERS_KEPT"]

# The identity key of a client-IP rule's alert: one row for every address (crossings.py).
EVERY_ADDRESS_KEY = "ip:every-address"
# How many of the addresses an aggregated alert names (those that used the most).
TOP_CALLERS_KEPT = 5


class Event(models.TextChoices):
    THRESHOLD_CROSSED = "quota.threshold_crossed", "A threshold below 100 % was crossed"
    EXHAUSTED = "quota.exhausted", "A threshold of 100 % was reached (the quota is used up)"
    CREDITS_LOW = "credits.low", "Prepaid credits: a threshold below 100 % of the last top-up used"
    CREDITS_EXHAUSTED = "credits.exhausted", "Prepaid credits: the last top-up used up"
    CALLER_BANNED = "caller.banned", "The penalty box banned callers (per rule and interval)"


def new_webhook_secret():
    """Return a new endpoint secret as Standard Webhooks spell one: ``whsec_`` and 32 random
    bytes in base64."""
    return new_secret()


class SignatureScheme(models.TextChoices):
    STANDARD = "standard", "Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature)"
    BOTH = "both", ("Standard Webhooks and the former X-Ratelimit-Signature (while a receiver "
                    "made before 0.2.0 moves over)")


class WebhookEndpoint(models.Model):
    """A receiver of alert webhooks. Its secret signs every delivery (signing.py); it is shown
    once, when the endpoint is added, and kept in the database to sign with (it cannot be a
    digest, as an API key's is: the sender needs the secret itself)."""

    name = models.CharField(max_length=100)
    url = models.URLField(
        "URL", max_length=500, validators=[URLValidator(schemes=["http", "https"])],
        help_text="Where deliveries are POSTed (http or https). Redirects are not followed.")
    events = models.CharField(
        max_length=200, default=",".join(Event.values),
        help_text="The events this endpoint receives.")
    secret = models.CharField(max_length=100, editable=False, default=new_webhook_secret)
    signature_scheme = models.CharField(
        "signature", max_length=10, choices=SignatureScheme.choices,
        default=SignatureScheme.STANDARD,
        help_text="How deliveries are signed. Endpoints added before 0.2.0 send both; choose "
                  "Standard Webhooks once the receiver verifies those headers.")
    enabled = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def event_list(self):
        """Return the event names this endpoint receives."""
        return [e for e in self.events.split(",") if e]

    def clean(self):
        unknown = sorted(set(self.event_list()) - set(Event.values))
        if unknown:
            raise ValidationError({"events": f"Unknown event(s): {', '.join(unknown)}; choose "
                                             f"from {', '.join(Event.values)}."})
        if not self.event_list():
            raise ValidationError({"events": "Choose at least one event, or untick “enabled”."})
        host = urlsplit(self.url).hostname
        refused = host and url_problem(host, get_config())
        if refused:
            raise ValidationError({"url": f"{refused}."})


class QuotaAlert(models.Model):
    """One identity crossed one threshold of one rule in one period (once: see the module)."""

    rule = models.ForeignKey("ratelimit_app.Rule", on_delete=models.CASCADE,
                             related_name="alerts")
    # the bucket's Redis key without values from the request in clear (decision/keys.py): one per
    # scope value (a user, a key, a tenant, an IP, the plan or everyone)
    identity_key = models.CharField(max_length=200)
    identity = models.CharField(max_length=300, blank=True,
                                help_text="The caller whose request crossed the threshold.")
    threshold = models.PositiveSmallIntegerField(help_text="Percent of the quota used.")
    period_start = models.DateTimeField()
    used = models.BigIntegerField(help_text="Units used after the request that crossed.")
    limit = models.BigIntegerField()
    # a client-IP rule's alert stands for every address that reached the threshold in the
    # period: how many did (as the workers reported them), and the few that used the most
    callers = models.PositiveIntegerField(
        default=1, help_text="Callers that reached the threshold in the period.")
    top_callers = models.JSONField(
        default=list, blank=True,
        help_text="A client-IP rule's alert: the addresses that used the most, with their usage.")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]
        constraints = [models.UniqueConstraint(
            fields=["rule", "identity_key", "threshold", "period_start"],
            name="ratelimit_alert_once_per_period")]

    def __str__(self):
        return f"{self.rule} {self.threshold} % ({self.identity or self.identity_key})"

    @property
    def aggregated(self):
        """True for a client-IP rule's alert, which counts every address in one row."""
        return self.identity_key == EVERY_ADDRESS_KEY

    @property
    def event(self):
        """Return the Event this alert is: a quota's, or a credit balance's (its rule's kind)."""
        if self.rule.kind == "credits":
            return Event.CREDITS_EXHAUSTED if self.threshold >= 100 else Event.CREDITS_LOW
        return Event.EXHAUSTED if self.threshold >= 100 else Event.THRESHOLD_CROSSED


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed (gave up)"


class WebhookDelivery(models.Model):
    """One alert to send to one endpoint: the outbox row. ``body`` is the exact JSON sent (and
    signed); ``next_attempt_at`` is when a sender may take it next (while ``sending``: when the
    sender's claim lapses, should it die mid-send)."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    alert = models.ForeignKey(QuotaAlert, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="deliveries")
    # a caller.banned delivery: the ban-log entry it announces (business/alerts/bans.py)
    ban_entry = models.ForeignKey("ratelimit_app.BanLogEntry", null=True, blank=True,
                                  on_delete=models.SET_NULL, related_name="deliveries")
    event = models.CharField(max_length=50)
    body = models.TextField()
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices,
                              default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(db_index=True)
    give_up_at = models.DateTimeField(help_text="No attempt after this: the delivery fails.")
    created = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "webhook deliveries"
        constraints = [models.UniqueConstraint(fields=["endpoint", "alert"],
                                               name="ratelimit_delivery_once_per_endpoint")]

    def __str__(self):
        return f"{self.event} → {self.endpoint}"
