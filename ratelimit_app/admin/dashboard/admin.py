"""``DashboardAdmin``: the dashboard as the changelist of the table-less ``Dashboard`` model.

Hosting it in the admin gives it the admin's login, staff check, look, index link and history.
The caller pages (admin/callers/views.py) are views of this admin too.
Permissions: ``ratelimit_app.view_dashboard`` to see anything, ``ratelimit_app.reset_buckets``
to reset a client's buckets. Every view goes through ``admin_site.admin_view`` (anonymous and
non-staff users are sent to the admin login) and then checks the permission (403 otherwise).
"""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.views.decorators.http import require_POST

from ...conf import get_config
from ...runtime.limiter import default_limiter
from ...stores import StoreUnavailable
from ..callers.views import CallerViews
from ..readonly import ReadOnlyAdmin
from .data import FRAGMENTS, dashboard_data, inspect_url
from .inspector import find_identity, reset_and_record

__all__ = ["DashboardAdmin"]

VIEW_PERMISSION = "ratelimit_app.view_dashboard"
RESET_PERMISSION = "ratelimit_app.reset_buckets"


class DashboardAdmin(CallerViews, ReadOnlyAdmin):
    """No rows to add, change or delete: the changelist is the dashboard. Its caller pages
    (admin/callers/) are views of it too."""

    def has_module_permission(self, request):
        return request.user.has_perm(VIEW_PERMISSION)

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW_PERMISSION)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="ratelimit_app_dashboard_changelist"),
            path("data.json", wrap(self.data_view), name="ratelimit_app_dashboard_data"),
            *self.caller_urls(),
            path("reset/", wrap(require_POST(self.reset_view)),
                 name="ratelimit_app_dashboard_reset"),
        ]

    def _require(self, request, permission):
        if not request.user.has_perm(permission):
            raise PermissionDenied

    def _context(self, request, title):
        return {**self.admin_site.each_context(request), "title": title, "opts": self.opts,
                "has_view_permission": True, "refresh_s": get_config()["DASHBOARD_REFRESH_S"],
                "can_reset": request.user.has_perm(RESET_PERMISSION)}

    def changelist_view(self, request, extra_context=None):
        """The dashboard page (the admin index links here)."""
        self._require(request, VIEW_PERMISSION)
        data = dashboard_data(request.GET.get("window", "1h"))
        context = {**self._context(request, "Rate-limit dashboard"), "data": data,
                   "fragments": data["html"], "fragment_names": list(FRAGMENTS)}
        return TemplateResponse(request, "ratelimit_app/dashboard.html", context)

    def data_view(self, request):
        """The JSON the page polls: numbers, series, tables, health and the HTML fragments."""
        self._require(request, VIEW_PERMISSION)
        response = JsonResponse(dashboard_data(request.GET.get("window", "1h")))
        response["Cache-Control"] = "no-store"
        return response

    def reset_view(self, request):
        """POST without ``confirm``: the confirmation page. POST with it: delete the client's
        bucket keys, bump the config version and record the action in the admin history."""
        self._require(request, RESET_PERMISSION)
        snapshot = default_limiter().snapshot()
        lookup = find_identity(request.POST.get("ref", ""), snapshot)
        if lookup.identity is None:
            messages.error(request, "No such client; nothing was reset.")
            return HttpResponseRedirect(inspect_url(lookup.query))
        ref = lookup.identity.ref
        if request.POST.get("confirm") != "yes":
            context = {**self._context(request, "Reset buckets?"), "lookup": lookup,
                       "ref": ref}
            return TemplateResponse(request, "ratelimit_app/caller_reset.html", context)
        try:
            message = reset_and_record(lookup, snapshot, request.user)
        except StoreUnavailable as exc:
            messages.error(request, f"Redis is unavailable; nothing was reset ({exc}).")
            return HttpResponseRedirect(inspect_url(ref))
        messages.success(request, message)
        return HttpResponseRedirect(inspect_url(ref))
