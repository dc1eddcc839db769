"""Model admins for plans, rules, endpoint costs, API keys and overrides, and the simulator.

Validation lives in the models' ``clean()`` and in ``forms.py``; the simulator's logic in
``simulator.py``. This module wires them into the admin.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import Count
from django.http import HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.http import urlencode

from ..conf import get_config
from ..config.endpoints import endpoint_names
from ..config.models import (
    ApiKey,
    EndpointCost,
    IdentityOverride,
    Kind,
    Mode,
    Plan,
    PlanAssignment,
    Rule,
    Schedule,
    Scheduled,
    cost_limit,
)
from ..config.override_words import override_sentence
from ..config.rule_kinds import FORM_KINDS, form_kind_of
from ..config.wording import SCOPE_SHORT, count
from ..decision.identity import limited_ip
from ..runtime.limiter import default_limiter
from .audit import AuditedAdminMixin
from .callers.links import caller_link, ref_of_key, ref_of_user
from .forms import (
    MISSING_ENDPOINT,
    EndpointCostForm,
    EndpointCostInlineFormSet,
    RuleForm,
    SimulatorForm,
    is_missing_endpoint,
)
from .list_cells import day
from .override_forms import OverrideForm, override_fieldsets, override_from_input, override_words
from .placement import admin_url_name
from .rule_forms import (
    kind_for,
    not_a_number,
    rule_fieldsets,
    rule_form_class,
    rule_from_input,
    status_of,
)
from .simulator import simulate
from .traffic import impact_of_new_numbers, last_hour_traffic
from .widgets import LABELLED_DATETIMES, LabelledAutocompleteSelect


def _endpoint_cell(endpoint, empty_text):
    """An endpoint for a list or read-only cell, flagged when it left the URLconf."""
    if not endpoint:
        return empty_text
    if is_missing_endpoint(endpoint):
        return format_html('{} <strong style="color: var(--error-fg)">⚠ {}</strong>',
                           endpoint, MISSING_ENDPOINT)
    return endpoint


# What the words panel says until the numbers it needs are typed.
WORDS_PENDING = "Type the numbers to read the rule in words."


def rule_words(rule, key=""):
    """Return the words panel's sentence for ``rule`` (saved or typed so far) in the words of
    the form kind ``key`` (default: the kind the rule's fields make it)."""
    kind = FORM_KINDS[key] if key in FORM_KINDS else form_kind_of(rule)
    return kind.sentence(rule) or WORDS_PENDING


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


# A rule's status in the rules list: its mode and whether it is enabled, in one word.
RULE_STATUS_WORDS = {"enforce": "enforced", "shadow": "shadow", "disabled": "off"}


class RuleStatusFilter(admin.SimpleListFilter):
    """Rules by status: enforced, shadow (counted, never refused) or off (disabled)."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("enforced", "Enforced"), ("shadow", "Shadow"), ("off", "Off")]

    def queryset(self, request, queryset):
        if self.value() == "enforced":
            return queryset.filter(enabled=True, mode=Mode.ENFORCE)
        if self.value() == "shadow":
            return queryset.filter(enabled=True, mode=Mode.SHADOW)
        if self.value() == "off":
            return queryset.filter(enabled=False)
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


class EndpointCostInline(admin.TabularInline):
    model = EndpointCost
    form = EndpointCostForm
    formset = EndpointCostInlineFormSet
    extra = 0
    fields = ["endpoint", "method", "cost", "metered", "minimum"]
    verbose_name = "endpoint cost for this plan"
    verbose_name_plural = "endpoint costs for this plan (override the costs of every plan)"


class PlanAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """The plan page is the hub: its rules in words (each a link to edit it, and a link to add
    one of each kind), its endpoint costs inline, who is on it and its last hour's traffic."""

    list_display = ["name", "slug", "default_cell", "rule_count", "cost_count", "requests_cell",
                    "refused_cell"]
    list_filter = ["default_for_authenticated", "default_for_anonymous"]
    search_fields = ["slug", "name", "description"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [EndpointCostInline]
    change_form_template = "admin/ratelimit_app/plan/change_form.html"
    # a short description box: the plan's rules and callers follow it on the same screen
    formfield_overrides = {models.TextField: {"widget": forms.Textarea(attrs={"rows": 3,
                                                                             "cols": 80})}}

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            rule_count=Count("rules", distinct=True), cost_count=Count("costs", distinct=True))

    def get_changelist_instance(self, request):
        """The list, each plan given its last hour's traffic (one Redis read for the page)."""
        changelist = super().get_changelist_instance(request)
        traffic = last_hour_traffic("plan")
        for plan in changelist.result_list:
            plan.traffic = traffic.get(plan.slug) if traffic is not None else None
        return changelist

    @admin.display(description="default for")
    def default_cell(self, plan):
        return ", ".join(who for who, default in (
            ("signed-in callers", plan.default_for_authenticated),
            ("anonymous callers", plan.default_for_anonymous)) if default) or "—"

    @admin.display(description="rules", ordering="rule_count")
    def rule_count(self, plan):
        return plan.rule_count

    @admin.display(description="own costs", ordering="cost_count")
    def cost_count(self, plan):
        return plan.cost_count

    @admin.display(description="requests (1 h)")
    def requests_cell(self, plan):
        return _requests_cell(getattr(plan, "traffic", None))

    @admin.display(description="429 (1 h)")
    def refused_cell(self, plan):
        return _refused_cell(getattr(plan, "traffic", None))

    def get_inline_instances(self, request, obj=None):
        # Costs are checked against their plan's rules: the plan must exist first. The add
        # page says so (see add_view).
        return super().get_inline_instances(request, obj) if obj is not None else []

    def add_view(self, request, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "subtitle":
                         "Save the plan first (“Save and continue editing”), then add its "
                         "rules and endpoint costs from its page."}
        return super().add_view(request, form_url, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        plan = self.get_object(request, unquote(object_id))
        context = dict(extra_context or {})
        if plan is not None:
            context["hub"] = plan_hub(plan)
        return super().change_view(request, object_id, form_url, context)


def _requests_cell(traffic):
    return "—" if traffic is None else count(traffic["requests"])


def _refused_cell(traffic):
    return "—" if not traffic or not traffic["requests"] else f"{traffic['rate']} %"


def plan_hub(plan):
    """Return what the plan page shows beside the plan's own fields: its rules in words (and
    those of every plan), links to add a rule of each kind, its callers and last hour."""
    def lines(rules):
        return [{"rule": rule, "words": rule.describe(),
                 "url": reverse("admin:ratelimit_app_rule_change", args=[rule.pk])
                 + "?" + urlencode({"plan": plan.pk})} for rule in rules]

    add_url = reverse("admin:ratelimit_app_rule_add")
    traffic = last_hour_traffic("plan")
    return {
        "rules": lines(plan.rules.order_by("name")),
        "shared_rules": lines(Rule.objects.filter(plan__isnull=True).order_by("name")),
        "add_links": [{"label": kind.label, "url": add_url + "?" + urlencode(
            {"kind": key, "plan": plan.pk})} for key, kind in FORM_KINDS.items()],
        "assignments": plan.assignments.count(),
        "assignments_url": reverse(admin_url_name(PlanAssignment, "changelist"))
        + f"?plan__id__exact={plan.pk}",
        "api_keys": ApiKey.objects.filter(plan=plan).count(),
        "api_keys_url": reverse(admin_url_name(ApiKey, "changelist"))
        + f"?plan__id__exact={plan.pk}",
        "traffic": traffic.get(plan.slug) if traffic is not None else None,
        "traffic_known": traffic is not None,
    }


class RuleAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """Rules: a form per kind of limit (the add page asks the kind first, as Django's user
    form asks the password first), the rule in words as it is typed, and a list that reads at
    a glance with the last hour's traffic of each rule."""

    form = RuleForm
    change_form_template = "admin/ratelimit_app/rule/change_form.html"
    list_display = ["name", "plan", "scope_cell", "limit_cell", "status_cell", "last_hour_cell"]
    # in Django's filter sidebar: the filters an operator reaches for (a rule's counting and
    # its on-Redis-failure are read on its page)
    list_filter = ["plan", RuleStatusFilter, "scope", "kind", EndpointFilter]
    list_select_related = ["plan"]
    search_fields = ["name", "endpoint", "plan__name", "plan__slug"]
    readonly_fields = ["updated"]

    def _form_kind(self, request, obj):
        return kind_for(obj, request.GET.get("kind", "")) or Kind.TOKEN_BUCKET.value

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = rule_form_class(self._form_kind(request, obj))
        return super().get_form(request, obj, change, **kwargs)

    def get_fieldsets(self, request, obj=None):
        return rule_fieldsets(self._form_kind(request, obj))

    def get_changelist_instance(self, request):
        """The list, each rule given its last hour's traffic (one Redis read for the page)."""
        changelist = super().get_changelist_instance(request)
        traffic = last_hour_traffic("rule")
        for rule in changelist.result_list:
            rule.traffic = traffic.get(rule.name) if traffic is not None else None
        return changelist

    @admin.display(description="scope", ordering="scope")
    def scope_cell(self, rule):
        return SCOPE_SHORT.get(rule.scope, rule.scope)

    @admin.display(description="limit")
    def limit_cell(self, rule):
        words = form_kind_of(rule).limit_words(rule) or "—"
        if is_missing_endpoint(rule.endpoint):
            return format_html('{} <strong style="color: var(--error-fg)">⚠ {}</strong>',
                               words, MISSING_ENDPOINT)
        return words

    @admin.display(description="status", ordering="enabled")
    def status_cell(self, rule):
        return RULE_STATUS_WORDS[status_of(rule)]

    @admin.display(description="last hour")
    def last_hour_cell(self, rule):
        """The requests and the share refused in one cell (one column fewer: the list fits
        beside the filter sidebar at 1280 px)."""
        traffic = getattr(rule, "traffic", None)
        if traffic is None:
            return "—"
        if not traffic["requests"]:
            return "no requests"
        return format_html("{}<br>{} refused", _requests_cell(traffic),
                           _refused_cell(traffic))

    def add_view(self, request, form_url="", extra_context=None):
        """Without a kind, the page that asks for it (links: no JavaScript needed); with one,
        that kind's form."""
        if not kind_for(None, request.GET.get("kind", "")):
            if not self.has_add_permission(request):
                raise PermissionDenied
            return self._choose_kind_view(request)
        return super().add_view(request, form_url, extra_context)

    def _choose_kind_view(self, request):
        plan = request.GET.get("plan", "")
        kinds = [{"key": key, "label": kind.label, "text": kind.chooser_text,
                  "url": "?" + urlencode({"kind": key, **({"plan": plan} if plan else {})})}
                 for key, kind in FORM_KINDS.items()]
        context = {**self.admin_site.each_context(request), "title": "Add a rule: which kind?",
                   "opts": self.opts, "kinds": kinds, "has_view_permission": True}
        return TemplateResponse(request, "admin/ratelimit_app/rule/choose_kind.html", context)

    def render_change_form(self, request, context, add=False, change=False, form_url="",
                           obj=None):
        form = context["adminform"].form
        key = form.rule_kind.key
        rule = rule_from_input(key, form.data, obj) if form.is_bound else obj
        words = (form.is_bound and not_a_number(key, form.data)) or \
            (rule_words(rule, key) if rule else WORDS_PENDING)
        context.update({
            "rule_kind": form.rule_kind, "rule_kind_key": key,
            "rule_words": words,
            "preview_url": reverse("admin:ratelimit_app_rule_preview"),
        })
        return super().render_change_form(request, context, add, change, form_url, obj)

    def preview_view(self, request):
        """The form's words while it is typed (JSON): the rule as a sentence and, for a saved
        rule whose numbers changed, what they would have done to the last hour's callers."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        key = kind_for(None, request.GET.get("kind", ""))
        if not key:
            return JsonResponse({"error": "Give the kind of the rule."}, status=400)
        saved = None
        rule_id = request.GET.get("rule", "")
        if rule_id.isascii() and rule_id.isdigit() and len(rule_id) <= 18:
            saved = Rule.objects.select_related("plan").filter(pk=int(rule_id)).first()
        typo = not_a_number(key, request.GET)
        if typo:  # said as such, never read as a number nor as "type the numbers"
            answer = {"words": typo, "impact": ""}
        else:
            rule = rule_from_input(key, request.GET, saved)
            answer = {"words": rule_words(rule, key),
                      "impact": impact_of_new_numbers(saved, rule) if saved is not None else ""}
        response = JsonResponse(answer)
        response["Cache-Control"] = "no-store"
        return response

    def _back_to_plan(self, request, obj):
        """After a save from the plan page's links (``?plan=``), back to that plan."""
        if request.GET.get("plan") and obj.plan_id and "_save" in request.POST:
            return HttpResponseRedirect(
                reverse("admin:ratelimit_app_plan_change", args=[obj.plan_id]))
        return None

    def response_add(self, request, obj, post_url_continue=None):
        return self._back_to_plan(request, obj) or \
            super().response_add(request, obj, post_url_continue)

    def response_change(self, request, obj):
        return self._back_to_plan(request, obj) or super().response_change(request, obj)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if cost_limit(obj) is not None:  # a rule an endpoint's cost is charged to in tokens
            warning = max_cost_warning(obj.burst, f"Rule “{obj.name}”")
            if warning:
                messages.warning(request, warning)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        own = [path("simulate/", wrap(self.simulator_view), name="ratelimit_app_rule_simulate"),
               path("preview/", wrap(self.preview_view), name="ratelimit_app_rule_preview")]
        return [*own, *super().get_urls()]  # before the catch-all "<object_id>/"

    def simulator_view(self, request):
        """The read-only “what would this request do” page (staff who may view rules)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        # the callers picked by search, as on the overrides' form
        pickers = caller_pickers(self.admin_site, request)
        # the caller's page links here with the caller alone: a prefilled form, not yet run
        form = SimulatorForm(request.GET, pickers=pickers) if "endpoint" in request.GET else \
            SimulatorForm(initial=request.GET.dict() or None, pickers=pickers)
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
    list_display = ["endpoint_cell", "method", "plan_cell", "cost_cell"]
    list_filter = ["plan", "method", "metered", EndpointFilter]
    list_select_related = ["plan"]
    search_fields = ["endpoint", "plan__name", "plan__slug"]

    @admin.display(description="endpoint", ordering="endpoint")
    def endpoint_cell(self, cost):
        return _endpoint_cell(cost.endpoint, "—")

    @admin.display(description="plan", ordering="plan__name")
    def plan_cell(self, cost):
        return cost.plan or "every plan"

    @admin.display(description="cost", ordering="cost")
    def cost_cell(self, cost):
        """'5 tokens', or a metered endpoint's estimate and minimum charge in words."""
        tokens = f"{cost.cost} token{'' if cost.cost == 1 else 's'}"
        if not cost.metered:
            return tokens
        return f"{tokens} to start, then what it reports (at least {cost.minimum})"


class PlanAssignmentAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["user", "plan", "tenant", schedule_cell, "reason", "caller_page"]
    list_filter = ["plan", ScheduleFilter]
    list_select_related = ["user", "plan"]
    search_fields = ["user__username", "tenant"]
    raw_id_fields = ["user"]
    formfield_overrides = LABELLED_DATETIMES

    @admin.display(description="caller page")
    def caller_page(self, assignment):
        return caller_link(ref_of_user(assignment.user_id), "page")


class ApiKeyAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ["prefix_cell", "name_cell", "user_cell", "plan_and_schedule", "why",
                    "tenant", "active", "created_cell"]
    list_filter = ["plan", ScheduleFilter, "active"]
    list_select_related = ["user", "plan"]
    search_fields = ["prefix", "name", "user__username", "tenant", "reason"]
    raw_id_fields = ["user"]
    readonly_fields = ["prefix", "created"]
    formfield_overrides = LABELLED_DATETIMES

    @admin.display(description="key", ordering="prefix")
    def prefix_cell(self, key):
        return f"{key.prefix}…"

    def get_changelist_instance(self, request):
        """The list, each key given the plan its requests get now and where it comes from
        (from the policy in force: one look-up for the page, not one per row)."""
        changelist = super().get_changelist_instance(request)
        try:
            snapshot = default_limiter().snapshot()
        except Exception:  # the policy cannot be had now: the rows' own plans, as before
            return changelist
        names = {plan.slug: plan.name for plan in Plan.objects.all()}
        for key in list(changelist.result_list):
            key.plan_in_force = _key_plan(key, snapshot, names)
        return changelist

    @admin.display(description="user", ordering="user__username")
    def user_cell(self, key):
        return caller_link(ref_of_user(key.user_id), key.user)

    @admin.display(description="name", ordering="name")
    def name_cell(self, key):
        """The key's name, linked to its caller page (the key cell opens its row)."""
        return caller_link(ref_of_key(key.pk), key.name)

    @admin.display(description="plan", ordering="plan__slug")
    def plan_and_schedule(self, key):
        """The plan the key's requests get now and where it comes from: its own (with where
        its dates stand), its user's assignment ("its user's"), or the default."""
        plan, source = getattr(key, "plan_in_force", (key.plan, "its own") if key.plan_id
                               else ("", "its user's"))
        if key.plan_id and source == "its own":
            return format_html("{}, {}", plan, schedule_cell(key))
        in_force = format_html("{} <small>({})</small>", plan, source) if plan else source
        if key.plan_id:  # its own plan, outside its dates now
            return format_html("{}; its own {}, {}", in_force, key.plan, schedule_cell(key))
        return in_force

    @admin.display(description="why", ordering="reason")
    def why(self, key):
        return key.reason or "—"

    @admin.display(description="created", ordering="created")
    def created_cell(self, key):
        return day(key.created)

    def get_queryset(self, request):
        # ordered for Django's autocomplete (an override's caller), which pages the rows; the
        # list orders them its own way
        return super().get_queryset(request).order_by("prefix", "pk")

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


def _key_plan(key, snapshot, names):
    """Return ``(plan name, where it comes from)`` of an API key's requests under the policy
    ``snapshot`` (as identity.plan_of decides, PLAN_RESOLVER aside)."""
    entry = snapshot.api_keys.get(key.digest)
    assignment = snapshot.assignments.get(str(key.user_id))
    if entry is not None and entry.plan:
        slug, source = entry.plan, "its own"
    elif assignment:
        slug, source = assignment[0], "its user's"
    else:
        slug, source = snapshot.default_authenticated_plan, "default"
    return names.get(slug, slug or ""), source


class IdentityOverrideAdmin(AuditedAdminMixin, admin.ModelAdmin):
    """Overrides: "× 2 for 7 days", exempt, or numbers of its own (``override_forms.py``),
    callers picked by search (autocomplete), the override read as a sentence as it is typed,
    and a list of sentences, each with its end. The add page takes the admin's usual
    prefill: ``?user=<id>``, ``?api_key=<id>``, ``?ip=<address>``, ``&rule=<id>``."""

    form = OverrideForm
    change_form_template = "admin/ratelimit_app/identityoverride/change_form.html"
    # the sentence names the caller and the rules and leads (the link to the override's page);
    # where the dates stand, why, and the caller's page beside it
    list_display = ["sentence", schedule_cell, "why", "caller_page"]
    list_display_links = ["sentence"]
    list_filter = ["exempt", ScheduleFilter, "rule"]
    list_select_related = ["user", "api_key", "rule"]
    search_fields = ["user__username", "api_key__prefix", "ip", "reason"]
    formfield_overrides = LABELLED_DATETIMES

    @admin.display(description="caller page")
    def caller_page(self, override):
        """The caller's page (the caller cell links to the override itself)."""
        if override.api_key_id:
            return caller_link(ref_of_key(override.api_key_id), "page")
        if override.user_id:
            return caller_link(ref_of_user(override.user_id), "page")
        return caller_link(f"ip:{limited_ip(override.ip) or override.ip}", "page")

    @admin.display(description="override")
    def sentence(self, override):
        """The override in words: who gets what, until when."""
        return override_sentence(override, timezone.now())

    @admin.display(description="why", ordering="reason")
    def why(self, override):
        return override.reason or "—"

    def get_autocomplete_fields(self, request):
        """The callers picked by search: a user or an API key, wherever its admin has
        search_fields (the stock UserAdmin does; a project's own user admin may not, and then
        its id is typed)."""
        return [name for name in ("user", "api_key") if _searchable(self.admin_site, name)]

    def get_raw_id_fields(self, request):
        return [name for name in ("user", "api_key") if not _searchable(self.admin_site, name)]

    def get_fieldsets(self, request, obj=None):
        return override_fieldsets(obj)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name in ("user", "api_key", "rule") and \
                hasattr(field.widget, "can_add_related"):
            # no popups: a caller is found by search, a rule's numbers are in the sentence
            # (and an API key added in a popup would show its secret there)
            widget = field.widget
            widget.can_add_related = widget.can_change_related = False
            widget.can_view_related = widget.can_delete_related = False
        return field

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = LabelledAutocompleteSelect(
                db_field, self.admin_site, CALLER_SEARCH_WORDS[db_field.name],
                using=kwargs.get("using"))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def render_change_form(self, request, context, add=False, change=False, form_url="",
                           obj=None):
        form = context["adminform"].form
        if form.is_bound:
            override = form.instance
        elif obj is not None:
            override = obj
        else:
            override = override_from_input(_initial_data(form))
        words, numbers_now = override_words(override)
        context.update({"override_words": words, "rule_numbers_now": numbers_now,
                        "preview_url": reverse(admin_url_name(IdentityOverride, "preview",
                                                              self.admin_site))})
        return super().render_change_form(request, context, add, change, form_url, obj)

    def preview_view(self, request):
        """The override in words while it is typed (JSON): the sentence, and the numbers of
        the rules it changes as they are now."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        words, numbers_now = override_words(override_from_input(request.GET))
        response = JsonResponse({"words": words, "impact": numbers_now})
        response["Cache-Control"] = "no-store"
        return response

    def get_urls(self):
        wrap = self.admin_site.admin_view
        own = [path("preview/", wrap(self.preview_view),
                    name="ratelimit_app_identityoverride_preview")]
        return [*own, *super().get_urls()]  # before the catch-all "<object_id>/"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        warning = None if obj.exempt or obj.factor is not None else \
            max_cost_warning(obj.burst, f"The override of {obj}")
        if warning:
            messages.warning(request, warning)


# What an empty caller picker says (its accessible name until a caller is chosen).
CALLER_SEARCH_WORDS = {"user": "Search users by name", "api_key": "Search keys by prefix or name"}


def caller_pickers(site, request):
    """Return the overrides' form's search pickers of a user and an API key (``{"user":
    widget, "api_key": widget}``, those whose admin has search_fields) for another form that
    names a caller (the simulator's); {} without an overrides' admin on ``site``."""
    override_admin = next((model_admin for model, model_admin in site._registry.items()
                           if issubclass(model, IdentityOverride)), None)
    if override_admin is None:
        return {}
    fields = override_admin.model._meta
    return {name: override_admin.formfield_for_dbfield(fields.get_field(name), request).widget
            for name in override_admin.get_autocomplete_fields(request)}


def _searchable(site, field_name):
    """True when the model ``field_name`` of an override points to has an admin with
    search_fields on ``site`` (what Django's autocomplete needs)."""
    related = IdentityOverride._meta.get_field(field_name).related_model
    return site.is_registered(related) and bool(site.get_model_admin(related).search_fields)


def _initial_data(form):
    """The add page's first values as a form would post them (the prefill from the query
    string, the fields' initial values), for its first sentence."""
    data = {}
    for name in ("user", "api_key", "ip", "rule", "treatment", "factor"):
        value = form.initial.get(name, form.fields[name].initial if name in form.fields else None)
        if value not in (None, ""):
            data[name] = str(getattr(value, "pk", value))
    return data
