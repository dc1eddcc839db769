"""Where each model admin is registered: on the app's model, or on its group's proxy.

Django's admin index makes one section per app label. The optional group apps
(``ratelimit_app/groups/``: Callers, Billing, Alerts, Monitoring, Protection) each hold proxies
of some of the app's models; when one is installed, the model's admin is registered on the
proxy, so its pages live under the group (``/admin/ratelimit_billing/creditaccount/``), and the
index, the sidebar and the breadcrumbs name the group. The admin classes are the same either way.

These promises keep a project's existing staff and links working:

- Permissions are the app model's (``ratelimit_app.view_creditaccount``): ``GroupPlacedAdmin``
  asks each permission of the same admin class registered on the app's model.
- Django's history page of an object lists its changes from before the move too, and those
  made while its page was in another group (the allow and deny lists were under Callers).
- The old addresses answer: ``MovedAdmin``, hidden from the index, is registered on the app's
  model and sends each of its paths to the same path under the group (308: a POST is sent again
  with its body), and keeps its URL names (``admin:ratelimit_app_creditaccount_change``)
  reversible.
- The app's own links go straight to the new address: ``placement.admin_url_name``.

This module finds the proxies in Django's app registry; it never imports the group apps (they
sit above the admin in the layers, ``.importlinter``).
"""

from django.apps import apps
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import PAGE_VAR
from django.contrib.contenttypes.models import ContentType
from django.http import HttpResponsePermanentRedirect
from django.urls import URLPattern, re_path, reverse

from ..business.alerts.models import QuotaAlert, WebhookDelivery, WebhookEndpoint
from ..business.credits.models import CreditAccount, CreditTopUp
from ..business.usage.models import UsageRecord
from ..config.models import (
    AccessListEntry,
    ApiKey,
    AuditEntry,
    Ban,
    BanLogEntry,
    BanRule,
    EndpointCost,
    IdentityOverride,
    Plan,
    PlanAssignment,
    Rule,
)
from ..metrics.models import Dashboard
from .access_lists import AccessListEntryAdmin
from .alerts import QuotaAlertAdmin, WebhookDeliveryAdmin, WebhookEndpointAdmin
from .audit import AuditEntryAdmin
from .bans import BanAdmin, BanLogEntryAdmin, BanRuleAdmin
from .config import (
    ApiKeyAdmin,
    EndpointCostAdmin,
    IdentityOverrideAdmin,
    PlanAdmin,
    PlanAssignmentAdmin,
    RuleAdmin,
)
from .credits import CreditAccountAdmin, CreditTopUpAdmin
from .dashboard.admin import DashboardAdmin
from .simulator_admin import SimulatorAdmin
from .placement import GROUPS_PACKAGE
from .usage import UsageRecordAdmin

__all__ = ["GroupPlacedAdmin", "MovedAdmin", "register_admins"]

# Every model of the app that has admin pages, and its admin class.
ADMIN_CLASSES = {
    Plan: PlanAdmin, Rule: RuleAdmin, EndpointCost: EndpointCostAdmin,
    ApiKey: ApiKeyAdmin, PlanAssignment: PlanAssignmentAdmin,
    IdentityOverride: IdentityOverrideAdmin, AccessListEntry: AccessListEntryAdmin,
    CreditAccount: CreditAccountAdmin, CreditTopUp: CreditTopUpAdmin,
    UsageRecord: UsageRecordAdmin,
    QuotaAlert: QuotaAlertAdmin, WebhookEndpoint: WebhookEndpointAdmin,
    WebhookDelivery: WebhookDeliveryAdmin,
    Dashboard: DashboardAdmin, AuditEntry: AuditEntryAdmin,
    BanRule: BanRuleAdmin, Ban: BanAdmin, BanLogEntry: BanLogEntryAdmin,
}

# ModelAdmin's template attributes and the file each names by default: a placed admin looks
# for the app's own overrides (admin/ratelimit_app/<model>/…) after the group's.
_TEMPLATES = {
    "change_form_template": "change_form.html",
    "change_list_template": "change_list.html",
    "delete_confirmation_template": "delete_confirmation.html",
    "delete_selected_confirmation_template": "delete_selected_confirmation.html",
    "object_history_template": "object_history.html",
    "popup_response_template": "popup_response.html",
}


def _url_prefix(opts):
    return f"{opts.app_label}_{opts.model_name}_"


class GroupPlacedAdmin:
    """Mixed before a model admin registered on a group's proxy (see ``placed_admin_class``).

    ``permissions_of``: the same admin class on the app's model, which answers every permission
    question, its own overrides included, so a staff user's ``ratelimit_app.*`` permissions
    decide (the proxies have none of their own).
    """

    concrete_admin_class = None  # set by placed_admin_class

    def __init__(self, model, admin_site):
        super().__init__(model, admin_site)
        self.concrete_opts = model._meta.concrete_model._meta
        self.permissions_of = self.concrete_admin_class(model._meta.concrete_model, admin_site)
        for attribute, name in _TEMPLATES.items():
            if getattr(self, attribute) is None:
                setattr(self, attribute, [
                    f"admin/{self.opts.app_label}/{self.opts.model_name}/{name}",
                    f"admin/{self.opts.app_label}/{name}",
                    f"admin/{self.concrete_opts.app_label}/{self.opts.model_name}/{name}",
                    f"admin/{self.concrete_opts.app_label}/{name}",
                    f"admin/{name}"])

    def has_module_permission(self, request):
        return self.permissions_of.has_module_permission(request)

    def has_view_permission(self, request, obj=None):
        return self.permissions_of.has_view_permission(request, obj)

    def has_add_permission(self, request):
        return self.permissions_of.has_add_permission(request)

    def has_change_permission(self, request, obj=None):
        return self.permissions_of.has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self.permissions_of.has_delete_permission(request, obj)

    def history_view(self, request, object_id, extra_context=None):
        """Django's history page, listing the changes logged against the app's model too (those
        made before the group app was installed: the admin logs a proxy's as the proxy's)."""
        response = super().history_view(request, object_id, extra_context)
        context = getattr(response, "context_data", None)
        if not context or "action_list" not in context:  # no such object: a redirect
            return response
        entries = LogEntry.objects.filter(
            object_id=unquote(object_id), content_type__in=self._logged_types(),
        ).select_related("user", "content_type")
        paginator = self.get_paginator(request, entries.order_by("action_time"), 100)
        page = paginator.get_page(request.GET.get(PAGE_VAR, 1))
        context.update(action_list=page, page_range=paginator.get_elided_page_range(page.number),
                       pagination_required=paginator.count > 100)
        return response

    def _logged_types(self):
        """The content types the admin logged this model's changes under: the app model's,
        and every group's proxy of it, this one's and a group that held it before (the allow
        and deny lists moved from Callers to Protection; their old proxy's rows stay)."""
        labels = {self.concrete_opts.app_label} | {
            app_config.label for app_config in apps.get_app_configs()
            if app_config.name.startswith(GROUPS_PACKAGE + ".")}
        return ContentType.objects.filter(app_label__in=labels,
                                          model=self.concrete_opts.model_name)

    def get_urls(self):
        # The admin classes name their own extra views after the app's label
        # ("ratelimit_app_creditaccount_top_up"); under the group they take the group's, as the
        # stock views do, so ``opts|admin_urlname`` finds them on either label.
        old, new = _url_prefix(self.concrete_opts), _url_prefix(self.opts)
        patterns = super().get_urls()
        for pattern in patterns:
            if pattern.name and pattern.name.startswith(old):
                pattern.name = new + pattern.name.removeprefix(old)
        return patterns


def placed_admin_class(admin_class):
    """Return ``admin_class`` made to serve a group's proxy (``GroupPlacedAdmin`` first)."""
    return type(admin_class.__name__, (GroupPlacedAdmin, admin_class),
                {"concrete_admin_class": admin_class, "__module__": admin_class.__module__})


class MovedAdmin(admin.ModelAdmin):
    """The app's model once its pages moved to a group: every old path answers with a 308 to
    the same path under the group (query string kept, a POST sent again with its body), and
    the old URL names stay reversible. Not in the index nor the sidebar."""

    moved_to = None  # the group's proxy (set by moved_admin_class)

    def has_module_permission(self, request):
        return False

    def get_model_perms(self, request):
        return {"add": False, "change": False, "delete": False, "view": False}

    def get_urls(self):
        placed = self.admin_site.get_model_admin(self.moved_to)
        old, new = _url_prefix(self.opts), _url_prefix(self.moved_to._meta)
        named = [URLPattern(pattern.pattern, self.redirect_view,
                            name=old + pattern.name.removeprefix(new) if pattern.name else None)
                 for pattern in placed.get_urls()]
        return [*named, re_path(r"^.*$", self.redirect_view)]

    def get_queryset(self, request):
        # what Django's autocomplete searches (an override's API key): the placed admin's rows
        return self.admin_site.get_model_admin(self.moved_to).get_queryset(request)

    def redirect_view(self, request, *args, **kwargs):
        """Return a 308 to the request's path and query under the group's label."""
        root = reverse(f"{self.admin_site.name}:index")
        old_root = f"{root}{self.opts.app_label}/{self.opts.model_name}/"
        new_root = f"{root}{self.moved_to._meta.app_label}/{self.opts.model_name}/"
        return HttpResponsePermanentRedirect(
            new_root + request.get_full_path().removeprefix(old_root), preserve_request=True)


def moved_admin_class(proxy, admin_class):
    """Return the ``MovedAdmin`` of the app's model whose pages (of ``admin_class``) moved to
    ``proxy``. It keeps the admin's ``search_fields``: Django's autocomplete searches the
    admin of a relation's model, the app's (an override's API key), not the proxy's."""
    return type(f"Moved{proxy.__name__}Admin", (MovedAdmin,),
                {"moved_to": proxy, "search_fields": admin_class.search_fields})


def _group_proxies():
    """Return ``{app model: its proxy}`` of the installed group apps."""
    return {model._meta.concrete_model: model
            for app_config in apps.get_app_configs()
            if app_config.name.startswith(GROUPS_PACKAGE + ".")
            for model in app_config.get_models() if model._meta.proxy}


def register_admins(site):
    """Register every admin of the app on ``site``: on its group's proxy where a group app is
    installed (and ``MovedAdmin`` on the app's model), else on the app's model. Returns None."""
    proxies = _group_proxies()
    for model, admin_class in ADMIN_CLASSES.items():
        proxy = proxies.get(model)
        if proxy is None:
            site.register(model, admin_class)
            continue
        site.register(proxy, placed_admin_class(admin_class))
        site.register(model, moved_admin_class(proxy, admin_class))
    if apps.is_installed(f"{GROUPS_PACKAGE}.monitoring"):
        site.register(apps.get_model("ratelimit_monitoring", "Simulator"), SimulatorAdmin)
