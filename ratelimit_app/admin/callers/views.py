"""The caller's page and its actions, as views of the dashboard's admin (``CallerViews`` is
mixed into ``DashboardAdmin``, which gives them their URLs, the admin's login and the
dashboard's permission).

    callers/?q=…           find a caller (user name or email, key prefix or name, IP, ref) and
                           show its page; several matches: a list to choose from
    callers/end-override/  POST: end one of its overrides now
    callers/lift-ban/      POST: lift one of its bans
    inspect/?q=…           the old inspector's address: redirects to the caller's page
"""

import datetime

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path
from django.views.decorators.http import require_POST

from ...config.audit import Actor, acting_as
from ...config.models import AuditSource
from ...runtime.limiter import default_limiter
from ...stores import StoreUnavailable
from ..bans import lift_ban
from ..dashboard.data import inspect_url, parse_id
from ..dashboard.inspector import find_identity
from .caller import caller_of
from .page import caller_page
from .related import as_datetime, bans_of, overrides_of

__all__ = ["CallerViews"]

VIEW_PERMISSION = "ratelimit_app.view_dashboard"


class CallerViews:
    """The caller page's views; the host admin provides ``_require`` and ``_context``."""

    def caller_urls(self):
        wrap = self.admin_site.admin_view
        return [
            path("callers/", wrap(self.caller_view), name="ratelimit_app_dashboard_caller"),
            path("callers/end-override/", wrap(require_POST(self.end_override_view)),
                 name="ratelimit_app_dashboard_end_override"),
            path("callers/lift-ban/", wrap(require_POST(self.lift_ban_view)),
                 name="ratelimit_app_dashboard_lift_ban"),
            path("inspect/", wrap(self.inspect_view), name="ratelimit_app_dashboard_inspect"),
        ]

    def inspect_view(self, request):
        """The bucket inspector's old address: its page is now the caller's."""
        self._require(request, VIEW_PERMISSION)
        return HttpResponseRedirect(inspect_url(request.GET.get("q", "")))

    def caller_view(self, request):
        """Find a caller from what was typed and show its page (at its ref's address)."""
        self._require(request, VIEW_PERMISSION)
        snapshot = default_limiter().snapshot()
        lookup = find_identity(request.GET.get("q", ""), snapshot)
        if lookup.identity is None:
            context = {**self._context(request, "Find a caller"), "lookup": lookup}
            return TemplateResponse(request, "ratelimit_app/caller_search.html", context)
        if lookup.query != lookup.identity.ref:
            return HttpResponseRedirect(inspect_url(lookup.identity.ref))
        context = {**self._context(request, lookup.label), "lookup": lookup,
                   **caller_page(lookup, snapshot, request.user)}
        return TemplateResponse(request, "ratelimit_app/caller.html", context)

    def _posted_caller(self, request):
        lookup = find_identity(request.POST.get("ref", ""), default_limiter().snapshot())
        if lookup.identity is None:
            raise PermissionDenied  # a form of this page always names its caller
        return caller_of(lookup)

    def end_override_view(self, request):
        """End one of the caller's overrides now (audited; the config version follows)."""
        self._require(request, "ratelimit_app.change_identityoverride")
        caller = self._posted_caller(request)
        now = as_datetime(default_limiter().clock.wall_time())
        override = overrides_of(caller, now).filter(
            pk=parse_id(request.POST.get("override", "")) or 0).first()
        if override is None:
            messages.error(request, "That override has ended already or is not this caller's.")
            return HttpResponseRedirect(inspect_url(caller.ref))
        override.ends_at = now  # a row ending at now has ended (Schedule.EXPIRED)
        if override.starts_at and override.starts_at >= now:
            # a scheduled one never starts (and its end stays after its start)
            override.starts_at = now - datetime.timedelta(seconds=1)
        actor = Actor(request.user.get_username(), AuditSource.ADMIN, user=request.user)
        with acting_as(actor):
            override.save()
        messages.success(request, f"The override of {override} ended now.")
        return HttpResponseRedirect(inspect_url(caller.ref))

    def lift_ban_view(self, request):
        """Lift one of the bans in force on the caller (the bans list's own lift)."""
        self._require(request, "ratelimit_app.lift_ban")
        caller = self._posted_caller(request)
        now = as_datetime(default_limiter().clock.wall_time())
        ban = bans_of(caller, now).filter(pk=parse_id(request.POST.get("ban", "")) or 0).first()
        if ban is None:
            messages.error(request, "That ban has ended already or is not this caller's.")
            return HttpResponseRedirect(inspect_url(caller.ref))
        try:
            lift_ban(ban, request.user)
        except StoreUnavailable as exc:
            messages.error(request, f"Redis is unavailable; the ban was not lifted ({exc}).")
        else:
            messages.success(request, f"Lifted the ban of {ban.who} by {ban.rule_name}.")
        return HttpResponseRedirect(inspect_url(caller.ref))
