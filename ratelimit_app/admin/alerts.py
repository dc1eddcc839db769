"""The admin of quota alerts and webhooks: endpoints (secret shown once), deliveries (status,
attempts, last error, a re-send action), and the alerts stored (read only)."""

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from ..business.alerts.models import (
    DeliveryStatus,
    Event,
    SignatureScheme,
    WebhookEndpoint,
    new_webhook_secret,
)
from ..business.alerts.webhooks import resend
from .list_cells import day, moment, wrapping

__all__ = ["WebhookEndpointAdmin", "WebhookDeliveryAdmin", "QuotaAlertAdmin"]


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(label="URL", max_length=500, assume_scheme="https",
                         help_text=WebhookEndpoint._meta.get_field("url").help_text)
    events = forms.MultipleChoiceField(choices=Event.choices, widget=forms.CheckboxSelectMultiple,
                                       help_text="The events this endpoint receives.")

    class Meta:
        model = WebhookEndpoint
        fields = ["name", "url", "events", "signature_scheme", "enabled"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # the stored "a,b" as the boxes to tick (a new endpoint: the model's default, all)
        self.initial["events"] = self.instance.event_list()

    def clean_events(self):
        return ",".join(self.cleaned_data["events"])


class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ["name", "url_cell", "events_cell", "enabled", "created_cell"]
    list_filter = ["enabled", "signature_scheme"]
    search_fields = ["name", "url"]
    actions = ["rotate_secret"]

    @admin.display(description="URL", ordering="url")
    def url_cell(self, endpoint):
        return wrapping(endpoint.url)

    @admin.display(description="events")
    def events_cell(self, endpoint):
        """'all events', or the events it receives, separated so the cell wraps."""
        events = endpoint.event_list()
        return "all events" if set(events) >= set(Event.values) else ", ".join(events) or "none"

    @admin.display(description="created", ordering="created")
    def created_cell(self, endpoint):
        return day(endpoint.created)

    def response_add(self, request, obj, post_url_continue=None):
        """Show the new endpoint's secret once, in the response to the POST that created it
        (never in a message, a redirect or a URL), with no-store so no cache keeps it."""
        return self._secret_page(request, obj, rotated=False)

    @admin.action(description="Replace the signing secret (shown once)", permissions=["change"])
    def rotate_secret(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Select one endpoint: its new secret is shown once.",
                              messages.ERROR)
            return None
        endpoint = queryset.get()
        endpoint.secret = new_webhook_secret()
        # a receiver given the new secret verifies the standard headers: the former one keyed
        # with the former secret's text, which a new secret does not have
        endpoint.signature_scheme = SignatureScheme.STANDARD
        endpoint.save(update_fields=["secret", "signature_scheme"])
        return self._secret_page(request, endpoint, rotated=True)

    def _secret_page(self, request, endpoint, *, rotated):
        context = {
            **self.admin_site.each_context(request),
            "title": "Copy the endpoint's signing secret now",
            "opts": self.opts,
            "endpoint": endpoint,
            "secret": endpoint.secret,
            "rotated": rotated,
        }
        response = TemplateResponse(
            request, "admin/ratelimit_app/webhookendpoint/created.html", context)
        response["Cache-Control"] = "no-store"
        return response


class WebhookDeliveryAdmin(admin.ModelAdmin):
    # few columns: the list must fit beside the admin's sidebar (the rest is on the row's page)
    list_display = ["event", "endpoint", "status_cell", "last_error_cell", "next_attempt_cell"]
    list_filter = ["status", "event", "endpoint"]
    list_select_related = ["endpoint"]
    actions = ["resend_deliveries"]
    readonly_fields = ["endpoint", "alert", "event", "body", "status", "attempts", "last_error",
                       "last_status_code", "next_attempt_at", "give_up_at", "created", "sent_at"]

    def has_add_permission(self, request):
        return False  # deliveries are made by alerts

    @admin.display(description="status", ordering="status")
    def status_cell(self, delivery):
        attempts = f"{delivery.attempts} attempt{'' if delivery.attempts == 1 else 's'}"
        return f"{delivery.get_status_display()}, {attempts}"

    @admin.display(description="next attempt", ordering="next_attempt_at")
    def next_attempt_cell(self, delivery):
        if delivery.status in (DeliveryStatus.SENT, DeliveryStatus.FAILED):
            return "—"
        return moment(delivery.next_attempt_at)

    @admin.display(description="last error")
    def last_error_cell(self, delivery):
        error = delivery.last_error
        return wrapping(error if len(error) <= 80 else error[:79] + "…") if error else "—"

    @admin.action(description="Re-send the selected deliveries", permissions=["change"])
    def resend_deliveries(self, request, queryset):
        count = resend(queryset)
        self.message_user(request, f"{count} deliver{'y' if count == 1 else 'ies'} queued to be "
                                   f"sent again (by `manage.py ratelimit deliver`).",
                          messages.SUCCESS)


class QuotaAlertAdmin(admin.ModelAdmin):
    list_display = ["rule", "identity_cell", "crossed", "period_cell", "created_cell"]
    list_filter = ["threshold", "rule"]
    list_select_related = ["rule"]
    search_fields = ["identity", "identity_key", "rule__name"]
    readonly_fields = ["rule", "identity", "identity_key", "threshold", "used", "limit",
                       "callers", "top_callers", "period_start", "created"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="caller", ordering="identity")
    def identity_cell(self, alert):
        """The caller; a client-IP rule's alert: '300 addresses, the most by ip:… (…)'."""
        if alert.aggregated:
            count = f"{alert.callers} address{'' if alert.callers == 1 else 'es'}"
            return wrapping(f"{count}, the most by {alert.identity}")
        return wrapping(alert.identity)

    @admin.display(description="crossed", ordering="threshold")
    def crossed(self, alert):
        """'80 % (400 of 500 used)'; of the address that used the most when aggregated."""
        return f"{alert.threshold} % ({alert.used} of {alert.limit} used)"

    @admin.display(description="period from", ordering="period_start")
    def period_cell(self, alert):
        return day(alert.period_start)

    @admin.display(description="at", ordering="created")
    def created_cell(self, alert):
        return moment(alert.created)
