"""Model admins for plans, rules, endpoint costs, API keys and overrides, and the simulator.

Validation lives in the models' ``clean()`` and in ``forms.py``; the simulator's logic in
``simulator.py``. This module wires them into the admin.
"""

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import format_html

from ..conf import get_config
from ..config.endpoints import endpoint_names
from ..config.models import (
    ApiKey,
    CalendarPeriod,
    Counts,
    EndpointCost,
    IdentityOverride,
    Kind,
    Plan,
    PlanAssignment,
    Rule,
    Schedule,
    Scheduled,
)
from ..decision.scopes import Scope
from .audit import AuditedAdminMixin
from .forms import (
    MISSING_ENDPOINT,
    EndpointCostForm,
    EndpointCostInlineFormSet,
    PlanInlineFormSet,
    RuleForm,
    RuleInlineFormSet,
    SimulatorForm,
    is_missing_endpoint,
)
from .simulator import simulate


def _endpoint_cell(endpoint, empty_text):
    """An endpoint for a list or read-only cell, flagged when it left the URLconf."""
    if not endpoint:
        return empty_text
    if is_missing_endpoint(endpoint):
        return format_html('{} <strong style="color: var(--error-fg)">⚠ {}</strong>',
                           endpoint, MISSING_ENDPOINT)
    return endpoint


def _as_saved(rule):
    """Return ``rule`` as stored, or None if it is not saved yet.

    After a refused save the form has already copied the rejected input onto the instance
    (``ModelForm._post_clean``); the page's read-only descriptions must show what is kept,
    not a value the operator was just told is wrong.
    """
    return Rule.objects.filter(pk=rule.pk).first() if rule.pk else None


_WHO = {
    Scope.GLOBAL: "All clients together", Scope.PLAN: "All clients of the plan together",
    Scope.TENANT: "Each tenant", Scope.USER: "Each user or API key", Scope.IP: "Each client IP",
}


def explain_rule(rule):
    """Spell a rule out in a sentence, e.g. 'Each client IP: 20 tokens per 60 s (…)'."""
    if rule.kind == Kind.CALENDAR and rule.rate and rule.calendar_period:
        return explain_calendar_quota(rule)
    if rule.kind == Kind.CONCURRENCY:
        if not (rule.rate and rule.period_s):
            return "—"
        what = f"requests to {rule.endpoint}" if rule.endpoint else "requests"
        return (f"{_WHO.get(rule.scope, 'Each client')}: at most {rule.rate} {what} in flight "
                f"at once (whatever their cost); a slot is freed when its response is finished, "
                f"or {rule.period_s} s after it was taken if its worker died.")
    if not (rule.rate and rule.period_s and rule.burst):
        return "—"
    who = _WHO.get(rule.scope, "Each client")
    pace = f"per {rule.period_s} s (one more every {rule.period_s / rule.rate:.3g} s)"
    if rule.counts == Counts.FAILED_AUTH:
        where = f" at {rule.endpoint}" if rule.endpoint else ""
        return (f"{who}: {rule.rate} failed authentications{where} {pace}, at most "
                f"{rule.burst} in a row; while none are left, every request from that address "
                f"is refused, whatever credentials it sends.")
    if rule.endpoint:
        return (f"{who}: {rule.rate} requests to {rule.endpoint} {pace}, "
                f"at most {rule.burst} in a row.")
    return (f"{who}: {rule.rate} tokens {pace}, at most {rule.burst} saved up; each request "
            f"spends its endpoint's cost (1 token unless an endpoint cost says otherwise).")


def explain_calendar_quota(rule):
    """Spell a calendar quota out, e.g. 'Each user or API key: 1000 units per month, …'."""
    zone = get_config()["CALENDAR_TIME_ZONE"]
    resets = "midnight" if rule.calendar_period == CalendarPeriod.DAY else "midnight on the 1st"
    what = f"requests to {rule.endpoint}" if rule.endpoint else "units (each request its cost)"
    return (f"{_WHO.get(rule.scope, 'Each client')}: {rule.rate} {what} per "
            f"{rule.calendar_period}, all usable at once; the count starts again at {resets} "
            f"({zone}).")


def max_cost_warning(burst, what):
    """Return the warning for ``what`` (a rule or an override) whose ``burst`` is below the
    largest cost a client may declare in COST_HEADER, or None. Not an error: the operator may
    mean it, but such requests get a 429 that no wait cures."""
    config = get_config()
    if not config["COST_HEADER"] or not burst or burst >= config["MAX_COST"]:
        return None
    return (f"{what} has burst {burst}, below MAX_COST ({config['MAX_COST']}): a request "
            f"declaring a cost above {burst} in {config['COST_HEADER']} can never pass it and "
            f"is refused without Retry-After. Raise the burst or lower MAX_COST if that is "
            f"not meant.")


class EndpointFilter(admin.SimpleListFilter):
    """Find rows whose endpoint is gone from the URLconf (they never match a request)."""

    title = "endpoint"
    parameter_name = "endpoint_state"

    def lookups(self, request, model_admin):
        return [("current", "In the URLconf"), ("missing", "⚠ Not in the URLconf")]

    def queryset(self, request, queryset):
        known = endpoint_names()
        if self.value() == "current":
            return queryset.filter(endpoint__in=known)
        if self.value() == "missing":
            return queryset.exclude(endpoint__in=known).exclude(endpoint="")
        return queryset


class ScheduleFilter(admin.SimpleListFilter):
    """Rows with a start or an end, by where they stand now: active, scheduled or expired."""

    title = "schedule"
    parameter_name = "schedule"

    def lookups(self, request, model_admin):
        return [(Schedule.ACTIVE, "Active (temporary)"), (Schedule.SCHEDULED, "Scheduled"),
                (Schedule.EXPIRED, "Expired"), (Schedule.PERMANENT, "Permanent")]

    def queryset(self, request, queryset):
        now = timezone.now()
        dated = queryset.exclude(starts_at__isnull=True, ends_at__isnull=True)
        if self.value() == Schedule.ACTIVE:
            return dated.filter(Scheduled.active_q(now))
        if self.value() == Schedule.SCHEDULED:
            return queryset.filter(starts_at__gt=now)
        if self.value() == Schedule.EXPIRED:
            return queryset.filter(ends_at__lte=now)
        if self.value() == Schedule.PERMANENT:
            return queryset.filter(starts_at__isnull=True, ends_at__isnull=True)
        return queryset


def local_time(moment):
    """Return ``moment`` as the admin shows it: '28 Nov 2026 18:00' in the current zone."""
    return timezone.localtime(moment).strftime("%d %b %Y %H:%M")


@admin.display(description="schedule")
def schedule_cell(row):
    """Where a dated row stands now, with its start or end: 'active until 28 Nov 18:00'."""
    now = timezone.now()
    state = row.schedule_at(now)
    if state == Schedule.ACTIVE and row.ends_at:
        text = f"active until {local_time(row.ends_at)}"
    elif state == Schedule.SCHEDULED:
        text = f"scheduled from {local_time(row.starts_at)}"
    elif state == Schedule.EXPIRED:
        text = f"expired {local_time(row.ends_at)}"
    else:
        text = str(Schedule(state).label).lower()
    return format_html('<span class="ratelimit-schedule" data-schedule="{}">{}</span>',
                       state, text)


class RuleInline(admin.TabularInline):
    model = Rule
    form = RuleForm
    formset = RuleInlineFormSet
    extra = 0
    fields = ["name", "scope", "endpoint", "kind", "calendar_period", "rate", "period_s", "burst",
              "summary", "mode", "enabled"]
    readonly_fields = ["summary"]
    show_change_link = True

    @admin.display(description="in short")
    def summary(self, rule):
        saved = _as_saved(rule)
        return saved.describe() if saved else "—"


class EndpointCostInline(admin.TabularInline):
    model = EndpointCost
    form = EndpointCostForm
    formset = EndpointCostInlineFormSet
    extra = 0
    fields = ["endpoint", "method", "cost", "metered", "minimum"]
    verbose_name = "endpoint cost for this plan"
    verbose_name_plural = "endpoint costs for this plan (override the costs of every plan)"


class PlanAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "slug", "rule_count", "cost_count", "default_for_authenticated",
                    "default_for_anonymous"]
    list_filter = ["default_for_authenticated", "default_for_anonymous"]
    search_fields = ["slug", "name", "description"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [RuleInline, EndpointCostInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            rule_count=Count("rules", distinct=True), cost_count=Count("costs", distinct=True))

    @admin.display(description="rules", ordering="rule_count")
    def rule_count(self, plan):
        return plan.rule_count

    @admin.display(description="own endpoint costs", ordering="cost_count")
    def cost_count(self, plan):
        return plan.cost_count

    def get_inline_instances(self, request, obj=None):
        # Rules and costs are checked against their plan's other rows: the plan must exist
        # first. The add page says so (see add_view).
        return super().get_inline_instances(request, obj) if obj is not None else []

    def add_view(self, request, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "subtitle":
                         "Save the plan first (“Save and continue editing”), then add its "
                         "rules and endpoint costs on the same page."}
        return super().add_view(request, form_url, extra_context)

    def get_formset_kwargs(self, request, obj, inline, prefix):
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        # One list per request shared by the rule and cost inlines, so a rule and a cost
        # typed in the same save are checked against each other (forms.PlanInlineFormSet).
        if issubclass(inline.formset, PlanInlineFormSet):
            kwargs["siblings"] = request.__dict__.setdefault("_ratelimit_plan_inlines", [])
        return kwargs


class RuleAdmin(AuditedAdminMixin, admin.ModelAdmin):
    form = RuleForm
    list_display = ["name", "plan", "scope", "endpoint_cell", "kind", "summary", "mode",
                    "enabled"]
    list_filter = ["plan", "scope", "kind", "counts", "mode", "enabled", "on_redis_failure",
                   EndpointFilter]
    list_select_related = ["plan"]
    search_fields = ["name", "endpoint", "plan__name", "plan__slug"]
    readonly_fields = ["in_words", "updated"]
    fieldsets = [
        (None, {"fields": ["name", "plan", "scope", "endpoint", "counts"]}),
        ("Limit", {
            "fields": ["kind", "calendar_period", "rate", "period_s", "burst", "in_words",
                       "lease"],
            "description": "A <em>token bucket</em> holds up to <em>burst</em> tokens, refilled "
                           "with <em>rate</em> tokens every <em>period</em> seconds. A "
                           "<em>calendar quota</em> allows <em>rate</em> units per day or per "
                           "month (“1000 per month, resets on the 1st”), counted from 0 again "
                           "at midnight in the CALENDAR_TIME_ZONE setting; changing the rate "
                           "keeps what the current period has used. A <em>concurrency "
                           "limit</em> allows at most <em>rate</em> requests in flight at once "
                           "(“5 concurrent report exports per tenant”): each request holds a "
                           "slot until its response is finished; <em>period</em> is the timeout "
                           "in seconds after which the slot of a request that never finished "
                           "(a crashed worker) is freed — a little more than the slowest "
                           "response takes. Concurrency limits need QuotaMiddleware (which "
                           "releases the slots). A request passes only if "
                           "every rule that applies holds its cost.",
        }),
        ("Behaviour", {"fields": ["mode", "on_redis_failure", "enabled", "updated"]}),
        ("Metered costs", {
            "fields": ["debt"],
            "description": "A request to a metered endpoint is admitted on its estimate and "
                           "charged what it consumed once its response is finished: a request "
                           "that consumed more than the bucket held takes it below empty, down "
                           "to this many tokens, and its caller waits until the refill has "
                           "repaid the debt.",
            "classes": ["collapse"],
        }),
        ("Alerts", {"fields": ["alert_thresholds"],
                    "description": "Webhook endpoints and the deliveries sent are under "
                                   "“Webhook endpoints” and “Webhook deliveries”."}),
    ]

    @admin.display(description="endpoint", ordering="endpoint")
    def endpoint_cell(self, rule):
        return _endpoint_cell(rule.endpoint, "every endpoint")

    @admin.display(description="limit")
    def summary(self, rule):
        return rule.describe()

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not obj.endpoint and obj.counts == Counts.REQUESTS:  # endpoint rules count calls
            warning = max_cost_warning(obj.burst, f"Rule “{obj.name}”")
            if warning:
                messages.warning(request, warning)

    @admin.display(description="in words")
    def in_words(self, rule):
        saved = _as_saved(rule)
        return explain_rule(saved) if saved else "Shown once the rule is saved."

    def get_urls(self):
        simulator = path("simulate/", self.admin_site.admin_view(self.simulator_view),
                         name="ratelimit_app_rule_simulate")
        return [simulator, *super().get_urls()]  # before the catch-all "<object_id>/"

    def simulator_view(self, request):
        """The read-only “what would this request do” page (staff who may view rules)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        form = SimulatorForm(request.GET or None)
        result = simulate(**form.cleaned_data) if form.is_bound and form.is_valid() else None
        context = {
            **self.admin_site.each_context(request),
            "title": "What would this request do?",
            "subtitle": "A read-only look at the buckets: nothing is debited.",
            "opts": self.opts,
            "form": form,
            "result": result,
        }
        return TemplateResponse(request, "admin/ratelimit_app/simulator.html", context)


class EndpointCostAdmin(AuditedAdminMixin, admin.ModelAdmin):
    form = EndpointCostForm
    list_display = ["endpoint_cell", "method", "plan", "cost", "metered", "minimum"]
    list_filter = ["plan", "method", "metered", EndpointFilter]
    list_select_related = ["plan"]
    search_fields = ["endpoint", "plan__name", "plan__slug"]

    @admin.display(description="endpoint", ordering="endpoint")
    def endpoint_cell(self, cost):
        return _endpoint_cell(cost.endpoint, "—")


class PlanAssignmentAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["user", "plan", "tenant", schedule_cell, "reason"]
    list_filter = ["plan", ScheduleFilter]
    list_select_related = ["user", "plan"]
    search_fields = ["user__username", "tenant"]
    raw_id_fields = ["user"]


class ApiKeyAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["prefix", "name", "user", "plan_and_schedule", "tenant", "active", "created"]
    list_filter = ["plan", ScheduleFilter, "active"]
    list_select_related = ["user", "plan"]
    search_fields = ["prefix", "name", "user__username", "tenant", "reason"]
    raw_id_fields = ["user"]
    readonly_fields = ["prefix", "created"]

    @admin.display(description="plan", ordering="plan__slug")
    def plan_and_schedule(self, key):
        """The key's own plan, where its dates stand now and why (one column: the list is wide
        already); '—' without a plan (the key is on its user's)."""
        if not key.plan_id:
            return "—"
        reason = format_html('<br><span class="quiet">{}</span>', key.reason) if key.reason \
            else ""
        return format_html("{}<br>{}{}", key.plan, schedule_cell(key), reason)

    def get_fields(self, request, obj=None):
        fields = ["user", "name", "plan", "starts_at", "ends_at", "reason", "tenant", "active"]
        # the prefix is generated with the key: nothing to show before it exists
        return fields if obj is None else [*fields, "prefix", "created"]

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        # Kept on this request's instance only, for response_add. Never in a message: Django's
        # default message storage is a cookie (signed, not encrypted), and a redirect would
        # carry it there.
        obj.new_raw_key = obj.set_new_key()
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj, post_url_continue=None):
        """Show the new key once, in the response to the POST that created it (not through a
        message, a redirect or a URL), with no-store so no cache keeps it."""
        raw_key = getattr(obj, "new_raw_key", None)
        if raw_key is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "title": "Copy the new API key now",
            "opts": self.opts,
            "api_key": obj,
            "raw_key": raw_key,
        }
        response = TemplateResponse(request, "admin/ratelimit_app/apikey/created.html", context)
        response["Cache-Control"] = "no-store"
        return response


class IdentityOverrideAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["__str__", "rule", "exempt", schedule_cell, "reason", "note"]
    list_filter = ["exempt", ScheduleFilter, "rule"]
    list_select_related = ["user", "api_key", "rule"]
    search_fields = ["user__username", "api_key__prefix", "ip", "note", "reason"]
    raw_id_fields = ["user", "api_key"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        warning = None if obj.exempt else max_cost_warning(obj.burst, f"The override of {obj}")
        if warning:
            messages.warning(request, warning)
