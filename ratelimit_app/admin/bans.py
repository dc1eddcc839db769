"""The penalty box's admin: ban rules, the bans they imposed (lifted from here), and the ban
log (bans per rule and interval, lifts; config/ban_records.py)."""

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from ..config.audit import Actor
from ..config.models import AuditSource, BanRule
from ..runtime.limiter import default_limiter
from ..stores import StoreUnavailable
from .list_cells import moment
from .placement import admin_url_name
from .readonly import ReadOnlyAdmin

__all__ = ["BanRuleAdmin", "BanAdmin", "BanLogEntryAdmin"]


class BanRuleAdmin(admin.ModelAdmin):
    list_display = ["name", "in_words", "enabled"]
    list_filter = ["events", "scope", "mode", "enabled"]
    search_fields = ["name"]
    fieldsets = [
        (None, {"fields": ["name", "scope", "events", "statuses", "path_prefix"]}),
        ("When and how long", {"fields": ["threshold", "window_s", "ban_s"]}),
        ("Repeat offenders", {"fields": ["factor", "max_ban_s", "memory_s",
                                         "extend_on_retry"]}),
        ("Mode", {"fields": ["mode", "enabled"]}),
    ]

    @admin.display(description="in words")
    def in_words(self, rule):
        return rule.describe()


class BanAdmin(admin.ModelAdmin):
    list_display = ["who", "rule_name", "since_cell", "until_cell", "times", "state"]
    list_filter = ["shadow", "rule_name", "scope"]
    search_fields = ["who", "rule_name"]
    actions = ["lift_bans"]
    readonly_fields = ["rule_link", "rule_name", "scope", "who", "since", "until", "times",
                       "shadow", "lifted_at", "lifted_by"]
    exclude = ["key", "rule"]  # the rule is shown as rule_link

    def has_add_permission(self, request):
        return False  # bans are imposed by the penalty box

    @admin.display(description="rule")
    def rule_link(self, ban):
        """The ban rule, linked where its page is: Django's own link of a read-only foreign key
        names the app's model, whose old address only redirects once Protection holds it."""
        if ban.rule_id is None:
            return None  # deleted (the admin's empty value); rule_name still names it
        url = reverse(admin_url_name(BanRule, "change", self.admin_site),
                      args=[quote(ban.rule_id)])
        return format_html('<a href="{}">{}</a>', url, ban.rule)

    @admin.display(description="since", ordering="since")
    def since_cell(self, ban):
        return moment(ban.since)

    @admin.display(description="until", ordering="until")
    def until_cell(self, ban):
        return moment(ban.until)

    @admin.display(description="state")
    def state(self, ban):
        if ban.shadow:
            return "would-be ban (shadow)"
        if ban.lifted_at is not None:
            return f"lifted by {ban.lifted_by}"
        return "in force" if ban.until > timezone.now() else "ended"

    def has_lift_ban_permission(self, request):
        return request.user.has_perm("ratelimit_app.lift_ban")

    @admin.action(description="Lift the selected bans", permissions=["lift_ban"])
    def lift_bans(self, request, queryset):
        actor = Actor(request.user.get_username(), AuditSource.ADMIN, user=request.user)
        lifted = 0
        for ban in queryset.filter(shadow=False, lifted_at=None):
            try:
                default_limiter().protection.lift_ban(ban, actor)
            except StoreUnavailable as exc:
                self.message_user(request, f"Redis is unavailable; the ban of {ban.who} was not "
                                           f"lifted ({exc}).", messages.ERROR)
                return
            lifted += 1
        self.message_user(request, f"{lifted} ban{'' if lifted == 1 else 's'} lifted.",
                          messages.SUCCESS)


class BanLogEntryAdmin(ReadOnlyAdmin):
    """The ban log, read only: written by the penalty box's thread and by lifts."""

    list_display = ["at_cell", "__str__", "listed"]
    list_filter = ["kind", "shadow", "rule_name"]
    search_fields = ["rule_name", "who", "actor"]
    readonly_fields = ["kind", "at", "rule_name", "scope", "shadow", "interval_start", "bans",
                       "listed", "who", "actor"]
    exclude = ["rule", "callers"]

    @admin.display(description="when", ordering="at")
    def at_cell(self, entry):
        return moment(entry.at)

    @admin.display(description="callers listed")
    def listed(self, entry):
        """The first callers of a ban entry (at most BAN_ROWS_PER_INTERVAL): who, until."""
        return ", ".join(f"{caller['who']} (until {caller['until'][11:19]})"
                         for caller in entry.callers) or "—"
