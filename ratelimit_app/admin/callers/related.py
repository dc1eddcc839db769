"""What else concerns a caller, each with its action: its identity overrides (end now), its
prepaid credit accounts (top up), the bans in force on it (lift) and its usage records.

Actions go through the code their own pages use: a ban is lifted by ``admin.bans.lift_ban``
(the bans list's action), a top-up is the credit account's top-up page, an override ends by
saving its end as now (audited, and the config version bumped at commit as for any edit).
"""

import datetime
import zoneinfo

from django.contrib.admin.utils import quote
from django.db.models import Q, Sum
from django.urls import reverse
from django.utils import timezone

from ...business.credits.figures import CreditFigures
from ...business.credits.ledger import state_of
from ...business.credits.models import CreditAccount
from ...business.credits.rules import AccountRules
from ...business.usage.models import UsageRecord
from ...conf import get_config
from ...config.models import Ban, IdentityOverride
from ...config.override_words import treatment_words
from ...decision.keys import bucket_key
from ...decision.scopes import Scope
from ..dashboard.data import live_credit_states
from ..list_cells import moment
from ..placement import admin_url_name

__all__ = ["override_rows", "overrides_of", "override_params", "credit_rows", "ban_rows",
           "bans_of", "usage_summary", "as_datetime"]


def override_params(caller):
    """The GET parameters that prefill an override's add page with ``caller`` (the admin's
    standard initial values: ``user``, ``api_key`` or ``ip``)."""
    if caller.kind == "key":
        return {"api_key": caller.identity.api_key_id}
    if caller.kind == "user":
        return {"user": caller.identity.user_id}
    # an IPv6 client is its network ("2001:db8::/64"): the override names its first address
    return {"ip": caller.identity.ip.partition("/")[0]}


def overrides_of(caller, now):
    """The identity overrides that apply to the caller's requests and have not ended at
    ``now`` (a datetime): a key's own and its user's (engine.overrides_for), a user's, an
    address's."""
    identity = caller.identity
    if caller.kind == "anonymous":
        whose = Q(ip=override_params(caller)["ip"])
    else:
        whose = Q(user_id=identity.user_id)
        if caller.kind == "key":
            whose |= Q(api_key_id=identity.api_key_id)
    return IdentityOverride.objects.filter(whose).filter(
        Q(ends_at__isnull=True) | Q(ends_at__gt=now)).select_related("rule")


def override_rows(caller, now):
    """Return the caller's overrides as dicts: ``id``, ``rule``, ``users`` (a key's user's
    override, not the key's own), ``limit`` (in words),
    ``starts``/``ends`` (text), ``why`` and ``url`` (its change page)."""
    return [{"id": o.pk, "rule": str(o.rule) if o.rule else "every user, key or IP rule",
             "users": caller.kind == "key" and o.user_id is not None,
             "limit": treatment_words(o), "starts": moment(o.starts_at) if o.starts_at else "",
             "ends": moment(o.ends_at) if o.ends_at else "no end",
             "why": o.reason,
             "url": reverse(admin_url_name(IdentityOverride, "change"), args=[quote(o.pk)])}
            for o in overrides_of(caller, now)]


def credit_rows(caller, snapshot):
    """Return the caller's prepaid credit accounts (its own, its tenant's) with their figures
    from the balance Redis holds (the last checkpoint's where it cannot be read): ``ref``,
    ``units_left``, ``prepaid_left``, ``live``, ``url`` and ``top_up_url``."""
    refs = [caller.ref] if caller.has_history else []
    if caller.identity.tenant:
        refs.append(f"tenant:{caller.identity.tenant}")
    accounts = list(CreditAccount.objects.filter(ref__in=refs).order_by("ref"))
    if not accounts:
        return []
    live = live_credit_states(accounts)
    rules = AccountRules(snapshot)
    rows = []
    for account in accounts:
        state = live.get(account.ref)
        figures = CreditFigures.of_account(rules, account.ref, state or state_of(account))
        rows.append({"ref": account.ref, "display": account.display,
                     "units_left": figures.units_left, "prepaid_left": figures.prepaid_left,
                     "live": state is not None,
                     "url": reverse(admin_url_name(CreditAccount, "change"),
                                    args=[quote(account.pk)]),
                     "top_up_url": reverse(admin_url_name(CreditAccount, "top_up"),
                                           args=[quote(account.pk)])})
    return rows


def _ban_keys(identity):
    """The caller keys a ban of ``identity`` is held in (protection/bans.py): its user or
    key's and its tenant's; an address's own for an anonymous caller."""
    scopes = (Scope.IP,) if identity.kind == "anonymous" else (Scope.USER, Scope.TENANT)
    prefix = get_config()["KEY_PREFIX"]
    tokens = (identity.token_for(scope) for scope in scopes)
    return [bucket_key(prefix, token) for token in tokens if token]


def bans_of(caller, now):
    """The bans in force on the caller at ``now`` (a datetime), latest first."""
    return Ban.objects.filter(key__in=_ban_keys(caller.identity), shadow=False,
                              lifted_at=None, until__gt=now)


def ban_rows(caller, now):
    """Return the bans in force on the caller: ``id``, ``rule``, ``scope``, ``since``,
    ``until``, ``times``."""
    return [{"id": ban.pk, "rule": ban.rule_name, "scope": ban.scope, "who": ban.who,
             "since": moment(ban.since), "until": moment(ban.until), "times": ban.times}
            for ban in bans_of(caller, now)]


def usage_summary(caller, now):
    """Return the caller's usage records this month (in CALENDAR_TIME_ZONE) as ``{"units",
    "allowed", "refused", "url"}``, the url the usage page filtered to the caller; None for an
    address (its usage is counted with every anonymous caller's)."""
    if not caller.has_history:
        return None
    day = timezone.localtime(now, timezone=zoneinfo.ZoneInfo(
        get_config()["CALENDAR_TIME_ZONE"])).date()
    first = day.replace(day=1)
    sums = UsageRecord.objects.filter(identity=caller.ref, day__gte=first, day__lte=day) \
        .aggregate(units=Sum("units"), allowed=Sum("allowed"), refused=Sum("refused"))
    url = reverse(admin_url_name(UsageRecord, "changelist")) + "?" + \
        f"caller={caller.ref}&date_from={first.isoformat()}&date_to={day.isoformat()}"
    return {**{name: value or 0 for name, value in sums.items()}, "url": url,
            "month": first.strftime("%B %Y")}



def as_datetime(unix_s):
    """The aware datetime of ``unix_s``."""
    return datetime.datetime.fromtimestamp(unix_s, tz=datetime.timezone.utc)
