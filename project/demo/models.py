"""What the demo's webhook receiver (receiver.py) was sent: one row per delivery it heard."""

import json

from django.db import models


class ReceivedWebhook(models.Model):
    """A POST the receiver got, verified or not. A delivery sent again (the sender delivers at
    least once) adds to ``times_received`` of its verified row instead of a new row."""

    received_at = models.DateTimeField(auto_now_add=True, db_index=True)
    delivery_id = models.CharField("delivery", max_length=40, blank=True, db_index=True,
                                   help_text="webhook-id: the sender's delivery id.")
    event = models.CharField(max_length=50, blank=True, help_text="The body's type.")
    signature = models.CharField(max_length=200, blank=True,
                                 help_text="webhook-signature, as received.")
    signature_valid = models.BooleanField(
        "signature valid",
        help_text="Signed with the secret of a webhook endpoint pointing here, and recent.")
    body = models.TextField(blank=True, help_text="The raw body (its start, if it was long).")
    times_received = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["-received_at", "-id"]

    def __str__(self):
        return f"{self.event or 'webhook'} #{self.delivery_id or '?'}"

    def alert(self):
        """Return the body's ``data`` (the alert) as a dict, or {} if the body is not one."""
        try:
            data = json.loads(self.body).get("data")
        except (ValueError, AttributeError):
            return {}
        return data if isinstance(data, dict) else {}
