"""The allow and deny lists' admin: entries in words, grouped by task, checked as typed.

A value is checked by ``AccessListEntry.clean()`` (which asks ``protection/lists.py`` what an
entry can match), so the form says what to write instead of a bad network, an IPv6 address
narrower than a caller, or a User-Agent part too short to mean anything.
"""

from django.contrib import admin

from ..config.models import ListKind
from .audit import AuditedAdminMixin
from .config import ScheduleFilter, schedule_cell
from .widgets import LABELLED_DATETIMES

__all__ = ["AccessListEntryAdmin"]


class AccessListEntryAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["list_cell", "matches_cell", "reason", schedule_cell]
    list_filter = ["kind", "target", "exempt", ScheduleFilter]
    list_select_related = ["user", "api_key"]
    search_fields = ["value", "reason", "user__username", "api_key__prefix"]
    raw_id_fields = ["user", "api_key"]
    formfield_overrides = LABELLED_DATETIMES
    fieldsets = [
        ("Which callers", {"fields": ["kind", "target", "value", "user", "api_key"]}),
        ("What it does", {"fields": ["exempt", "reason"]}),
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
