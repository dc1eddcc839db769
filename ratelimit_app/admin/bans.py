"""The penalty box's admin: ban rules, the bans they imposed (lifted from here), and the ban
log (bans per rule and interval, lifts; config/ban_records.py)."""

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from ..conf import get_config
from ..config.audit import Actor
from ..config.models import AuditSource, BanEvents, BanRule
from ..config.wording import per_period
from ..runtime.limiter import default_limiter
from ..stores import StoreUnavailable
from .ban_rule_forms import (
    BAN_FORM_KINDS,
    ban_kind_for,
    ban_rule_fieldsets,
    ban_rule_form_class,
    ban_rule_from_input,
)
from .callers.links import caller_link
from .config import WORDS_PENDING
from .list_cells import moment
from .placement import admin_url_name
from .readonly import ReadOnlyAdmin

__all__ = ["BanRuleAdmin", "BanAdmin", "BanLogEntryAdmin"]


class BanRuleAdmin(admin.ModelAdmin):
    """Ban rules: a form per kind of event counted (the add page asks the kind first, as the
    rules' does), the rule as a sentence as it is typed, and the same sentence in the list."""

    # the rules' form page: the kind, the fields, the sentence live (rule_form.js)
    change_form_template = "admin/ratelimit_app/rule/change_form.html"
    list_display = ["name", "in_words", "enabled"]
    list_filter = ["events", "scope", "mode", "enabled"]
    search_fields = ["name"]

    def _form_kind(self, request, obj):
        return ban_kind_for(obj, request.GET.get("kind", "")) or BanEvents.STATUSES.value

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = ban_rule_form_class(self._form_kind(request, obj))
        return super().get_form(request, obj, change, **kwargs)

    def get_fieldsets(self, request, obj=None):
        return ban_rule_fieldsets(self._form_kind(request, obj))

    @admin.display(description="in words")
    def in_words(self, rule):
        return rule.describe()

    def add_view(self, request, form_url="", extra_context=None):
        """Without a kind, the page that asks for it (links: no JavaScript needed); with one,
        that kind's form."""
        if not ban_kind_for(None, request.GET.get("kind", "")):
            if not self.has_add_permission(request):
                raise PermissionDenied
            kinds = [{"key": key, "label": kind.label, "text": kind.chooser_text,
                      "url": "?" + urlencode({"kind": key})}
                     for key, kind in BAN_FORM_KINDS.items()]
            context = {**self.admin_site.each_context(request),
                       "title": "Add a ban rule: which events count?", "opts": self.opts,
                       "kinds": kinds, "has_view_permission": True, "crumb": "Add a ban rule",
                       "intro": "A ban rule bans a caller for a while after it triggered too "
                                "many events of one kind. Choose the kind:"}
            return TemplateResponse(request, "admin/ratelimit_app/rule/choose_kind.html",
                                    context)
        return super().add_view(request, form_url, extra_context)

    def render_change_form(self, request, context, add=False, change=False, form_url="",
                           obj=None):
        form = context["adminform"].form
        key = form.ban_kind.key
        rule = ban_rule_from_input(key, form.data, obj) if form.is_bound else obj
        context.update({
            "rule_kind": form.ban_kind, "rule_kind_key": key,
            "rule_words": (rule.describe() if rule else "") or WORDS_PENDING,
            "preview_url": reverse(admin_url_name(BanRule, "preview", self.admin_site)),
        })
        return super().render_change_form(request, context, add, change, form_url, obj)

    def preview_view(self, request):
        """The form's sentence while it is typed (JSON), from ``BanRule.describe``: the same
        words as the list's."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        key = ban_kind_for(None, request.GET.get("kind", ""))
        if not key:
            return JsonResponse({"error": "Give the kind of events the rule counts."},
                                status=400)
        words = ban_rule_from_input(key, request.GET).describe() or WORDS_PENDING
        response = JsonResponse({"words": words, "impact": ""})
        response["Cache-Control"] = "no-store"
        return response

    def get_urls(self):
        # (named after the app's label; under a group, GroupPlacedAdmin renames it)
        own = [path("preview/", self.admin_site.admin_view(self.preview_view),
                    name="ratelimit_app_banrule_preview")]
        return [*own, *super().get_urls()]  # before the catch-all "<object_id>/"


def lift_ban(ban, user):
    """Lift ``ban`` now as the staff ``user`` (the bans list's action, and the caller's page):
    ended in Redis, logged, the deny caches told. Raises StoreUnavailable."""
    actor = Actor(user.get_username(), AuditSource.ADMIN, user=user)
    return default_limiter().protection.lift_ban(ban, actor)


class BanAdmin(admin.ModelAdmin):
    list_display = ["who", "rule_name", "since_cell", "until_cell", "times", "state",
                    "caller_page"]
    list_filter = ["shadow", "rule_name", "scope"]
    search_fields = ["who", "rule_name"]
    actions = ["lift_bans"]
    readonly_fields = ["rule_link", "rule_name", "scope", "who", "since", "until", "times",
                       "shadow", "lifted_at", "lifted_by"]
    exclude = ["key", "rule"]  # the rule is shown as rule_link

    change_list_template = "admin/ratelimit_app/ban/change_list.html"

    def has_add_permission(self, request):
        return False  # bans are imposed by the penalty box

    def changelist_view(self, request, extra_context=None):
        """The list; while it is empty, how a ban appears and how one is lifted."""
        config = get_config()
        context = {"ban_rules_url": reverse(admin_url_name(BanRule, "changelist",
                                                           self.admin_site)),
                   "rows_per_interval": config["BAN_ROWS_PER_INTERVAL"],
                   "log_interval": per_period(config["BAN_LOG_INTERVAL_S"]),
                   **(extra_context or {})}
        return super().changelist_view(request, context)

    @admin.display(description="rule")
    def rule_link(self, ban):
        """The ban rule, linked where its page is: Django's own link of a read-only foreign key
        names the app's model, whose old address only redirects once Protection holds it."""
        if ban.rule_id is None:
            return None  # deleted (the admin's empty value); rule_name still names it
        url = reverse(admin_url_name(BanRule, "change", self.admin_site),
                      args=[quote(ban.rule_id)])
        return format_html('<a href="{}">{}</a>', url, ban.rule)

    @admin.display(description="caller page")
    def caller_page(self, ban):
        """The banned caller's page, found as the caller search finds what ``who`` says (a
        user name, "key <prefix>…" or an address); a tenant's ban has none."""
        if ban.scope not in ("ip", "user"):
            return "—"
        return caller_link(ban.who, "page")

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
        lifted = 0
        for ban in queryset.filter(shadow=False, lifted_at=None):
            try:
                lift_ban(ban, request.user)
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
