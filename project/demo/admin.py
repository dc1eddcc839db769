"""The page of what the demo's webhook receiver got: read-only, for staff, in the admin."""

import json

from django.contrib import admin
from django.utils.html import format_html

from .models import ReceivedWebhook


@admin.register(ReceivedWebhook)
class ReceivedWebhookAdmin(admin.ModelAdmin):
    list_display = ["received_at", "event", "delivery", "alert_summary", "valid"]
    list_filter = ["signature_valid", "event"]
    fields = ["received_at", "event", "delivery_id", "signature", "signature_valid",
              "times_received", "pretty_body"]
    readonly_fields = fields

    @admin.display(description="delivery", ordering="delivery_id")
    def delivery(self, obj):
        # a delivery sent again (at least once) is stored once
        return obj.delivery_id if obj.times_received == 1 else \
            f"{obj.delivery_id} (×{obj.times_received})"

    @admin.display(description="valid", boolean=True, ordering="signature_valid")
    def valid(self, obj):
        return obj.signature_valid

    @admin.display(description="alert")
    def alert_summary(self, obj):
        alert = obj.alert()
        if not alert:
            return "—"
        return f"{alert.get('rule')} {alert.get('threshold_percent')} % · {alert.get('identity')}"

    @admin.display(description="body")
    def pretty_body(self, obj):
        try:
            text = json.dumps(json.loads(obj.body), indent=2)
        except ValueError:
            text = obj.body
        return format_html("<pre>{}</pre>", text)

    # what the receiver stored is a record: it is not added or edited here
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
