"""The admin of prepaid credits: the accounts (their balance live from Redis, a "Top up" form on
each account's page) and the ledger of top-ups (read only).

Rows are never added, changed or deleted here: an account is made by its first top-up or first
use, a top-up only through ``ledger.top_up`` (the form below). Who sees what: staff with
``ratelimit_app.view_creditaccount`` see the accounts, with ``view_credittopup`` the top-ups;
the form needs ``ratelimit_app.add_credittopup``.
"""

import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Max
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme

from ..business.credits.ledger import (
    TopUpConflict,
    client_of,
    state_of,
    stored_states,
    top_up,
)
from ..business.credits.figures import CreditFigures
from ..business.credits.models import MAX_TOP_UP_UNITS, CreditAccount, CreditTopUp
from ..business.credits.refs import (
    MAX_NOTE_LENGTH,
    MAX_TOP_UP_ID_LENGTH,
    CreditInputError,
)
from ..business.credits.rules import AccountRules
from ..conf import get_config
from ..runtime.limiter import default_limiter
from ..stores.base import READ_ERRORS
from .callers.links import caller_link
from .list_cells import day, moment, wrapping
from .placement import admin_url_name
from .readonly import ReadOnlyAdmin

__all__ = ["CreditAccountAdmin", "CreditTopUpAdmin", "TopUpForm"]

TOP_UP_PERMISSION = "ratelimit_app.add_credittopup"


class TopUpForm(forms.Form):
    """The account page's top-up. ``top_up_id`` is made when the form is shown: a form sent
    twice (a double click, a reload) carries one id, and is credited once."""

    units = forms.IntegerField(min_value=1, max_value=MAX_TOP_UP_UNITS,
                               help_text="Prepaid units to credit (a whole number).")
    note = forms.CharField(required=False, max_length=MAX_NOTE_LENGTH,
                           widget=forms.TextInput(attrs={"size": 60}),
                           help_text="Why (an invoice, an order, a goodwill credit).")
    top_up_id = forms.CharField(max_length=MAX_TOP_UP_ID_LENGTH, widget=forms.HiddenInput)

    @classmethod
    def fresh(cls):
        return cls(initial={"top_up_id": f"admin-{uuid.uuid4().hex}"})


def _live_states(accounts):
    """Return ``{ref: BalanceState}`` of the balances Redis holds for ``accounts`` (empty when
    Redis cannot be read: the pages then show the checkpoint's numbers, and say so)."""
    client = client_of(default_limiter().store)
    if client is None or not accounts:
        return {}
    try:
        states = stored_states(client, get_config()["KEY_PREFIX"], [a.ref for a in accounts])
    except READ_ERRORS:
        return {}
    return {ref: state for ref, state in states.items() if state is not None}


def _balances(accounts):
    """Return ``{ref: (BalanceState, live)}`` of ``accounts``: the balance Redis holds (one
    pipeline), else the last checkpoint's (``live`` False)."""
    live = _live_states(accounts)
    return {a.ref: (live.get(a.ref) or state_of(a), a.ref in live) for a in accounts}


def _rules_in_force():
    """The credits rules of the policy in force, which name each account's allowance."""
    return AccountRules(default_limiter().snapshot())


def _back_to(request):
    """The page a top-up was started from (``next``, as the caller's page passes it), if it
    is one of this site's; else None."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                  require_https=request.is_secure()):
        return target
    return None


class CreditAccountAdmin(ReadOnlyAdmin):
    list_display = ["ref", "display_cell", "units_left_cell", "prepaid_left_cell",
                    "allowance_used_cell", "used_in_period_cell", "last_top_up_cell",
                    "checkpoint_cell"]
    search_fields = ["ref", "display"]
    # the account's page leads with its "Top up" form and balance; the stored counters the
    # balance is computed from are for whoever debugs a checkpoint, folded away
    fieldsets = [
        (None, {"fields": ["ref", "display", "created"]}),
        ("Stored counters (as at the last checkpoint)", {
            "classes": ["collapse"],
            "fields": ["granted", "spent", "used", "period_start_ms", "seq", "checkpointed_at"],
        }),
    ]
    readonly_fields = [name for _, options in fieldsets for name in options["fields"]]
    change_form_template = "admin/ratelimit_app/creditaccount/change_form.html"

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(last_top_up=Max("top_ups__created"))

    def get_changelist_instance(self, request):
        """The list, its accounts given their figures (the balance Redis holds: one pipeline
        per page)."""
        changelist = super().get_changelist_instance(request)
        accounts = list(changelist.result_list)  # evaluated once: the page shows these rows
        balances, rules = _balances(accounts), _rules_in_force()
        for account in accounts:
            state, account.live = balances[account.ref]
            account.figures = CreditFigures.of_account(rules, account.ref, state)
        return changelist

    @staticmethod
    def _at_checkpoint(account, value):
        if account.live:
            return value
        # Redis holds none, or cannot be read: the checkpoint's numbers
        return format_html("{} <small>(at the checkpoint)</small>", value)

    @admin.display(description="display", ordering="display")
    def display_cell(self, account):
        """How staff know the account, linked to its caller's page (a key's or a user's)."""
        if account.ref.startswith(("key:", "user:")):
            return caller_link(account.ref, account.display or account.ref)
        return account.display

    @admin.display(description="units left")
    def units_left_cell(self, account):
        left = account.figures.units_left
        return self._at_checkpoint(account, "unknown" if left is None else left)

    @admin.display(description="prepaid left")
    def prepaid_left_cell(self, account):
        return self._at_checkpoint(account, account.figures.prepaid_left)

    @admin.display(description="allowance used")
    def allowance_used_cell(self, account):
        return account.figures.allowance_used_in_words()

    @admin.display(description="consumed this period")
    def used_in_period_cell(self, account):
        return account.figures.used_in_period

    @admin.display(description="last top-up", ordering="last_top_up")
    def last_top_up_cell(self, account):
        return day(account.last_top_up)

    @admin.display(description="checkpoint", ordering="checkpointed_at")
    def checkpoint_cell(self, account):
        return moment(account.checkpointed_at)

    def get_urls(self):
        wrap = self.admin_site.admin_view
        return [path("<path:object_id>/top-up/", wrap(self.top_up_view),
                     name="ratelimit_app_creditaccount_top_up"), *super().get_urls()]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        account = self.get_object(request, unquote(object_id))
        context = dict(extra_context or {})
        if account is not None:
            context.update(self._balance_context(account))
            if request.user.has_perm(TOP_UP_PERMISSION):
                context["top_up_form"] = TopUpForm.fresh()
                context["top_up_url"] = self._top_up_url(account)
        return super().change_view(request, object_id, form_url, context)

    def _balance_context(self, account):
        state, live = _balances([account])[account.ref]
        return {"balance": state,
                "figures": CreditFigures.of_account(_rules_in_force(), account.ref, state),
                "balance_is_live": live,
                "pending_units": max(0, account.granted - state.granted),
                "top_ups_url": reverse(admin_url_name(CreditTopUp, "changelist"))
                + f"?account__id__exact={account.pk}"}

    def _top_up_url(self, account):
        return reverse(admin_url_name(CreditAccount, "top_up"), args=[quote(account.pk)])

    def top_up_view(self, request, object_id):
        """Credit the form's top-up (POST), or show the form on a page of its own (GET, or
        input to correct); back to the account's page once credited."""
        account = self.get_object(request, unquote(object_id))
        if account is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not (self.has_view_permission(request, account)
                and request.user.has_perm(TOP_UP_PERMISSION)):
            raise PermissionDenied
        form = TopUpForm(request.POST) if request.method == "POST" else TopUpForm.fresh()
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                made, created = top_up(account.ref, data["units"], data["top_up_id"],
                                       note=data["note"], actor=request.user.get_username(),
                                       client=client_of(default_limiter().store))
            except (CreditInputError, TopUpConflict) as exc:
                form.add_error(None, str(exc))
            else:
                if created:
                    self.message_user(request, f"Credited {made.units} units to {account.ref} "
                                               f"(top-up {made.top_up_id}).", messages.SUCCESS)
                else:
                    self.message_user(request, f"This top-up ({made.units} units) was credited "
                                               f"before; nothing was credited again.",
                                      messages.WARNING)
                return HttpResponseRedirect(_back_to(request) or reverse(
                    admin_url_name(CreditAccount, "change"), args=[quote(account.pk)]))
        context = {**self.admin_site.each_context(request), "title": f"Top up {account}",
                   "opts": self.opts, "original": account, "has_view_permission": True,
                   "top_up_form": form, "top_up_url": self._top_up_url(account),
                   "back_to": _back_to(request), **self._balance_context(account)}
        return TemplateResponse(request, "admin/ratelimit_app/creditaccount/top_up.html",
                                context)


class CreditTopUpAdmin(ReadOnlyAdmin):
    list_display = ["top_up_cell", "account", "units", "created_cell", "actor", "note"]
    list_select_related = ["account"]
    search_fields = ["top_up_id", "account__ref", "account__display", "note"]
    date_hierarchy = "created"
    fields = ["top_up_id", "account", "units", "created", "actor", "note"]
    readonly_fields = fields

    @admin.display(description="top-up", ordering="top_up_id")
    def top_up_cell(self, made):
        return wrapping(made.top_up_id)

    @admin.display(description="at", ordering="created")
    def created_cell(self, made):
        return moment(made.created)
