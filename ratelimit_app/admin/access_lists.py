"""The allow and deny lists' admin: entries in words, grouped by task, checked as typed.

A value is checked by ``AccessListEntry.clean()`` (which asks ``protection/lists.py`` what an
entry can match), so the form says what to write instead of a bad network, an IPv6 address
narrower than a caller, or a User-Agent part too short to mean anything. An entry that would
deny, or exempt from quotas, a whole address family (``0.0.0.0/0``, ``::/0``, or what
normalises to one) is saved only once the operator ticks “I mean every caller”, as the import
needs ``--allow-everyone``.
"""

from django import forms
from django.contrib import admin

from ..config.models import AccessListEntry, ListKind
from .audit import AuditedAdminMixin
from .config import ScheduleFilter, schedule_cell
from .widgets import LABELLED_DATETIMES

__all__ = ["AccessListEntryAdmin", "AccessListEntryForm"]

CONFIRM_LABEL = "I mean every caller"


class AccessListEntryForm(forms.ModelForm):
    """The entry, and the confirmation an entry of a whole address family needs."""

    confirm_everyone = forms.BooleanField(
        label=CONFIRM_LABEL, required=False,
        help_text="Needed only for an entry that denies, or exempts from quotas, every "
                  "address of IPv4 or IPv6 (0.0.0.0/0, ::/0).")

    class Meta:
        model = AccessListEntry
        fields = "__all__"

    def _post_clean(self):
        super()._post_clean()  # the model's clean(): the value normalised on the instance
        if "value" in self.errors:
            return
        warning = self.instance.everyone_warning()
        if warning and not self.cleaned_data.get("confirm_everyone") and \
                not self._confirmed_before(warning):
            self.add_error("confirm_everyone", f"{warning} Tick “{CONFIRM_LABEL}” to save it.")

    def _confirmed_before(self, warning):
        """True if the saved entry already reached as far (an edit of its reason or dates
        asks nothing again)."""
        if not self.instance.pk:
            return False
        saved = AccessListEntry.objects.filter(pk=self.instance.pk).first()
        return saved is not None and saved.everyone_warning() == warning


class AccessListEntryAdmin(AuditedAdminMixin, admin.ModelAdmin):
    form = AccessListEntryForm
    list_display = ["list_cell", "matches_cell", "reason", schedule_cell]
    list_filter = ["kind", "target", "exempt", ScheduleFilter]
    list_select_related = ["user", "api_key"]
    search_fields = ["value", "reason", "user__username", "api_key__prefix"]
    raw_id_fields = ["user", "api_key"]
    formfield_overrides = LABELLED_DATETIMES
    fieldsets = [
        ("Which callers", {"fields": ["kind", "target", "value", "user", "api_key"]}),
        ("What it does", {"fields": ["exempt", "reason", "confirm_everyone"]}),
        ("When", {"fields": ["starts_at", "ends_at"],
                  "description": "Empty: from now on, until removed. An entry ends on time, "
                                 "on every worker."}),
    ]

    @admin.display(description="list", ordering="kind")
    def list_cell(self, entry):
        """'deny', 'allow (trusted)', or 'allow, exempt from quotas'."""
        if entry.kind == ListKind.DENY:
            return "deny"
        return "allow, exempt from quotas" if entry.exempt else "allow (trusted)"

    @admin.display(description="matches", ordering="target")
    def matches_cell(self, entry):
        return entry.matched_words()
