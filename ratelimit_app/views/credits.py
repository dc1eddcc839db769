"""The staff JSON API of prepaid credits, mounted by ``ratelimit_app.urls``:

- ``GET credits/<account>/``: the account's balance (see ``balance_body``); staff with
  ``ratelimit_app.view_creditaccount``.
- ``POST credits/<account>/top-ups/`` with ``{"units": 500, "top_up_id": "inv-2026-0042",
  "note": "..."}``: credit the units once per ``top_up_id``; staff with
  ``ratelimit_app.add_credittopup``. 201 with the top-up when it was credited now, 200 with the
  same body when that id was credited before (nothing credited again: a billing system may
  retry freely), 400 for bad input, 409 when the id was used for another account or number of
  units.

``<account>`` is ``key:<API key id>``, ``user:<user id>`` or ``tenant:<name>``. For billing
systems and scripts that sign in as staff (a session, so a POST carries Django's CSRF token;
or put it behind your own authentication). Errors are ``application/problem+json``; 403 for
anyone without the permission, 503 when Redis cannot be read (the balance; a top-up is stored
and reaches Redis at the next checkpoint). Not limited by the quotas: a staff tool, like the
admin.
"""

import datetime
import json

from django.http import JsonResponse
from django.views.decorators.http import require_http_methods, require_safe

from ..business.credits.ledger import TopUpConflict, balance, client_of, top_up
from ..business.credits.refs import CreditInputError
from ..business.credits.rules import AccountRules
from ..decision.headers import plain_problem
from ..decorators import ratelimit_exempt
from ..runtime.limiter import default_limiter
from ..stores.base import READ_ERRORS
from .staff import refuse_unless_staff_with

__all__ = ["credit_balance_view", "credit_top_up_view", "balance_body", "top_up_body"]

VIEW_PERMISSION = "ratelimit_app.view_creditaccount"
TOP_UP_PERMISSION = "ratelimit_app.add_credittopup"
# A top-up's JSON is a few short fields; anything much longer is not one.
MAX_BODY_BYTES = 4096


@ratelimit_exempt
@require_safe
def credit_balance_view(request, ref):
    """Return the balance of the account ``ref`` as JSON (see the module docstring)."""
    refused = refuse_unless_staff_with(request, VIEW_PERMISSION, "view credit accounts")
    if refused:
        return refused
    try:
        found = balance(ref, default_limiter().store.metrics_client())
    except CreditInputError as exc:
        return plain_problem(400, "Bad account", str(exc))
    except READ_ERRORS:
        return plain_problem(503, "Rate limiter store unavailable", "The balance is kept in "
                             "Redis, which cannot be read now. Retry later.")
    if found is None:
        return plain_problem(404, "No credit account", f"{ref} has had no top-up, and no "
                             f"credits rule has charged it.")
    return _json(balance_body(found, AccountRules(default_limiter().snapshot())), 200)


@ratelimit_exempt
@require_http_methods(["POST"])
def credit_top_up_view(request, ref):
    """Credit a top-up to the account ``ref`` once per its ``top_up_id`` (see the module
    docstring)."""
    refused = refuse_unless_staff_with(request, TOP_UP_PERMISSION, "top up credit accounts")
    if refused:
        return refused
    fields = _json_object(request)
    if isinstance(fields, str):
        return plain_problem(400, "Bad top-up", fields)
    unknown = sorted(set(fields) - {"units", "top_up_id", "note"})
    if unknown:
        return plain_problem(400, "Bad top-up", f"Unknown field(s): {', '.join(unknown)}; send "
                                                f"units, top_up_id and optionally note.")
    try:
        made, created = top_up(ref, fields.get("units"), fields.get("top_up_id"),
                               note=fields.get("note", ""),
                               actor=f"staff API: {request.user.get_username()}",
                               client=client_of(default_limiter().store))
    except CreditInputError as exc:
        return plain_problem(400, "Bad top-up", str(exc))
    except TopUpConflict as exc:
        return plain_problem(409, "Top-up id used before", str(exc))
    return _json(top_up_body(made, created), 201 if created else 200)


def _json_object(request):
    """Return the request's JSON object, or a sentence saying what is wrong with it."""
    if request.content_type != "application/json":
        return "Send the top-up as JSON (Content-Type: application/json)."
    if len(request.body) > MAX_BODY_BYTES:
        return f"The body is longer than {MAX_BODY_BYTES} bytes: a top-up is a few fields."
    try:
        fields = json.loads(request.body)
    except (ValueError, UnicodeDecodeError):
        return "The body is not valid JSON."
    if not isinstance(fields, dict):
        return 'Send a JSON object: {"units": 500, "top_up_id": "inv-42", "note": "..."}.'
    return fields


def balance_body(found, rules):
    """Return the JSON of a ledger.Balance: the units left and what they come from, its
    allowance found in ``rules`` (an AccountRules of the rules in force; see
    business/credits/figures.py for what each figure counts)."""
    state, account = found.state, found.account
    return {
        "account": account.ref, "display": account.display,
        **found.figures(rules).json_fields(),
        "granted": state.granted, "spent": state.spent,
        # top-ups in the ledger that Redis has not been given yet (the next checkpoint does)
        "pending_top_up_units": found.pending_units,
        # "redis": the live balance; "checkpoint": Redis holds none yet, the database's numbers
        "source": found.source,
        "checkpointed_at": _iso(account.checkpointed_at),
        "last_top_up": top_up_fields(found.last_top_up) if found.last_top_up else None,
    }


def top_up_body(made, created):
    """Return the JSON answer to a top-up: the top-up, whether it was credited now, and the
    account's granted total (the ledger's)."""
    return {"created": created, "top_up": top_up_fields(made),
            "account": made.account.ref, "granted": made.account.granted}


def top_up_fields(made):
    return {"top_up_id": made.top_up_id, "account": made.account.ref, "units": made.units,
            "created": _iso(made.created), "actor": made.actor, "note": made.note}


def _iso(moment):
    return moment.astimezone(datetime.timezone.utc).isoformat(timespec="seconds") \
        if moment else None


def _json(body, status):
    response = JsonResponse(body, status=status)
    response["Cache-Control"] = "no-store"
    return response
