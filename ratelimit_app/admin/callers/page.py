"""Everything a caller's page shows, in its order, as one context dict.

Who it is; its plan and where it comes from; every rule that applies with what is left now
and when it runs out; its last day; its overrides, credits, bans and usage; the links to act
(simulate a request as it, override its limits). ``now`` is read once from the Limiter's clock
(``clock.wall_time()``, the seam tests set), so every part of the page speaks of one moment.
"""

from django.contrib.auth import get_user_model
from django.urls import reverse
from django.utils.http import urlencode

from ...config.models import ApiKey, IdentityOverride
from ...runtime.limiter import default_limiter
from ...stores import StoreUnavailable
from ..dashboard.data import inspect_url
from ..placement import admin_url_name, simulator_url_name
from .caller import caller_of, plan_source
from .chart import hours_chart
from .history import caller_history
from .limits import limit_rows
from .links import admin_url
from .related import (as_datetime, ban_rows, credit_rows, override_params, override_rows,
                      usage_summary)

__all__ = ["caller_page", "simulate_params"]


def simulate_params(caller):
    """The simulator's GET parameters that prefill its form with ``caller`` (its pickers take
    ids)."""
    if caller.kind == "key" and caller.api_key is not None:
        return {"api_key": caller.api_key.pk}
    if caller.kind == "user" and caller.user is not None:
        return {"user": caller.user.pk}
    return {"ip": caller.identity.ip.partition("/")[0]}


def _who(caller):
    """The facts that say who the caller is, with links to its rows and related callers."""
    who = {"kind": caller.kind, "ip": caller.identity.ip, "tenant": caller.identity.tenant}
    User = get_user_model()
    user_change = f"admin:{User._meta.app_label}_{User._meta.model_name}_change"
    if caller.api_key is not None:
        key = caller.api_key
        who.update(key=key, key_url=admin_url(admin_url_name(ApiKey, "change"), key.pk),
                   user_page=inspect_url(f"user:{key.user_id}"))
    if caller.user is not None:
        who.update(user=caller.user, user_url=admin_url(user_change, caller.user.pk),
                   email=getattr(caller.user, User.get_email_field_name(), "") or "")
    if caller.kind == "user":
        who["keys"] = [{"key": key, "page": inspect_url(f"key:{key.pk}")}
                       for key in ApiKey.objects.filter(user_id=caller.identity.user_id)
                       .select_related("plan").order_by("pk")]
    return who


def caller_page(lookup, snapshot, staff):
    """Return the context of the page of the caller ``lookup`` found, as ``staff`` (the
    signed-in user, whose permissions decide which actions are offered) sees it."""
    caller = caller_of(lookup)
    now = default_limiter().clock.wall_time()
    now_dt = as_datetime(now)
    history = caller_history(caller, now)
    error = history["error"]
    try:
        rows, exempt = limit_rows(caller, snapshot, history["hours"], now)
    except StoreUnavailable as exc:
        rows, exempt, error = [], False, f"Redis is unavailable: {exc}"
    add = admin_url(admin_url_name(IdentityOverride, "add")) \
        if staff.has_perm("ratelimit_app.add_identityoverride") else ""
    override_add = f"{add}?{urlencode(override_params(caller))}" if add else ""
    for row in rows:
        row["override_url"] = f"{override_add}&rule={row['rule_id']}" if add else ""
    return {
        "caller": caller, "ref": caller.ref, "who": _who(caller),
        "plan": plan_source(caller, snapshot),
        "rows": rows, "exempt": exempt, "error": error,
        "refusing": [row for row in rows if row["state"] == "empty: refusing now"],
        "history": history,
        "chart_svg": hours_chart(history["hours"]) if history["hours"] else "",
        "overrides": override_rows(caller, now_dt),
        "credits": credit_rows(caller, snapshot),
        "bans": ban_rows(caller, now_dt),
        "usage": usage_summary(caller, now_dt),
        "simulate_url": reverse(simulator_url_name()) + "?" + urlencode(simulate_params(caller)),
        "override_add_url": override_add,
        "can_end_override": staff.has_perm("ratelimit_app.change_identityoverride"),
        "can_lift": staff.has_perm("ratelimit_app.lift_ban"),
        "can_top_up": staff.has_perm("ratelimit_app.add_credittopup"),
        "page_url": inspect_url(caller.ref),
    }
