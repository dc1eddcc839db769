"""Find a caller from what an operator types, read its buckets, reset them: for the caller's page
(admin/callers/) and ``manage.py ratelimit inspect`` and ``reset``.

A client is found by user name or email, API key prefix or name, IP address, or the ``ref`` a
hot-key row links with (``user:<id>``, ``key:<id>``, ``ip:<address>``). Its identity comes from
``identity.identify`` on a synthetic request, so plans, tenants and overrides resolve exactly as
they do for its real requests; buckets are read with a non-debiting Lua call.
"""

import dataclasses
import ipaddress

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db.models import Q
from django.http import HttpRequest

from ...config.models import ApiKey
from ...decision import engine
from ...decision.identity import identify
from ...decision.scopes import Scope
from ...metrics.models import Dashboard
from ...runtime.limiter import default_limiter
from .data import parse_id
from .text import counted

__all__ = ["Lookup", "find_identity", "bucket_rows", "acting_keys", "reset_buckets",
           "reset_and_record"]

MAX_QUERY_LENGTH = 200
# matches listed when a query finds several callers
MAX_CHOICES = 20
# Scopes whose buckets belong to one client (global, plan and tenant buckets are shared).
CLIENT_SCOPES = (Scope.USER, Scope.IP)


@dataclasses.dataclass
class Lookup:
    """What a query found: one ``identity``, several ``choices`` [(ref, label)], or nothing."""

    query: str
    identity: object = None
    label: str = ""
    choices: list = dataclasses.field(default_factory=list)


def key_label(api_key):
    return f"key {api_key.prefix}… ({api_key.user.get_username()} / {api_key.name})"


def _request(ip="0.0.0.0"):
    request = HttpRequest()
    request.META = {"REMOTE_ADDR": ip}
    request.method = "GET"
    return request


def _ip_identity(text, snapshot):
    try:
        network = ipaddress.ip_network(text, strict=False)
    except (ValueError, TypeError):
        return None
    # an IPv6 client is limited per network: any address of it finds the same buckets
    return identify(_request(str(network.network_address)), None, snapshot)


def _user_identity(user, snapshot):
    return identify(_request(), user, snapshot)


def _key_identity(api_key, snapshot):
    base = identify(_request(), api_key.user, snapshot)
    # the key's plan as requests see it: none outside its dates (nor for a revoked key)
    entry = snapshot.api_keys.get(api_key.digest)
    return base._replace(
        kind="key", display=f"key {api_key.prefix}…", api_key_id=api_key.id,
        user_id=str(api_key.user_id), tenant=api_key.tenant or base.tenant,
        plan=(entry.plan if entry else None) or base.plan)


def find_identity(query, snapshot):
    """Return a :class:`Lookup` for what an operator typed (never raises on odd input)."""
    text = (query or "").strip()[:MAX_QUERY_LENGTH]
    lookup = Lookup(query=text)
    # No user name, key prefix or address holds a NUL or a control character (and some
    # databases refuse NUL in a query): nothing can match.
    if not text or not text.isprintable():
        return lookup
    kind, _, value = text.partition(":")
    User = get_user_model()
    keys = ApiKey.objects.select_related("user", "plan")
    if kind == "key" and parse_id(value) is not None:
        api_key = keys.filter(pk=parse_id(value)).first()
        if api_key:
            lookup.identity, lookup.label = _key_identity(api_key, snapshot), key_label(api_key)
        return lookup
    if kind == "user" and parse_id(value) is not None:
        user = User.objects.filter(pk=parse_id(value)).first()
        if user:
            lookup.identity, lookup.label = _user_identity(user, snapshot), user.get_username()
        return lookup
    if kind == "ip":
        text = value
    identity = _ip_identity(text, snapshot)
    if identity is not None:
        lookup.identity, lookup.label = identity, f"IP {identity.ip}"
        return lookup
    user = User.objects.filter(**{User.USERNAME_FIELD: text}).first()
    if user is not None:
        lookup.identity, lookup.label = _user_identity(user, snapshot), user.get_username()
        return lookup
    users, found = _matching_users(User, text), _matching_keys(keys, text)
    if len(users) + len(found) == 1:
        if users:
            lookup.identity = _user_identity(users[0], snapshot)
            lookup.label = users[0].get_username()
        else:
            lookup.identity, lookup.label = _key_identity(found[0], snapshot), key_label(found[0])
    else:
        lookup.choices = [(f"user:{u.pk}", f"user {u.get_username()}") for u in users] + \
                         [(f"key:{k.id}", key_label(k)) for k in found]
    return lookup


def _matching_users(User, text):
    """The users whose email is ``text`` (any case), at most MAX_CHOICES."""
    email = User.get_email_field_name()
    if "@" not in text or not any(f.name == email for f in User._meta.get_fields()):
        return []
    return list(User.objects.filter(**{f"{email}__iexact": text}).order_by("pk")[:MAX_CHOICES])


def _matching_keys(keys, text):
    """The API keys whose prefix starts with ``text`` (3 characters at least) or whose name is
    ``text`` (any case), at most MAX_CHOICES."""
    prefix = text.removeprefix("key ").rstrip("…").strip()[:ApiKey.PREFIX_LENGTH]
    wanted = Q(name__iexact=text)
    if len(prefix) >= 3:
        wanted |= Q(prefix__startswith=prefix)
    return list(keys.filter(wanted).order_by("id")[:MAX_CHOICES])


def _client_buckets(identity, snapshot):
    """Return the buckets of every endpoint that apply to ``identity`` (None when exempt)."""
    # a signed-in client's IP buckets depend on where it calls from: inspect the IP
    return engine.client_buckets(snapshot, identity, ip_buckets=identity.kind == "anonymous")


def bucket_rows(identity, snapshot, endpoint=None, method="GET"):
    """Return ``(rows, exempt)``: one dict per bucket with rule, scope, endpoint, mode, tokens,
    capacity, percent and time to full. With ``endpoint``: only the buckets a ``method`` request
    to it is charged against, each row with its ``cost`` (None without). Raises
    ``StoreUnavailable``."""
    buckets = _client_buckets(identity, snapshot)
    if buckets is None:
        return [], True
    costs = {}
    if endpoint is not None:
        # the engine's own plan for one such request says which buckets and what they are charged
        cost = snapshot.cost_for(endpoint, method, identity.plan)
        costs = {b.id: b.cost for b in engine.plan_buckets(snapshot, identity, endpoint, cost)}
        buckets = [bucket for bucket in buckets if bucket.id in costs]
    if not buckets:
        return [], False
    statuses, _allowed = default_limiter().peek_buckets(buckets)
    rows = []
    for bucket, status in zip(buckets, statuses):
        rule = bucket.rule
        rows.append({
            "rule": rule.name, "scope": rule.scope, "endpoint": rule.endpoint or "every endpoint",
            "mode": "shadow" if rule.shadow else "enforce", "tokens": status.remaining,
            "capacity": status.burst, "percent": _percent(status),
            "full_in_s": status.full_s, "rate": _pace(rule, status),
            "own": rule.scope in CLIENT_SCOPES, "cost": costs.get(bucket.id),
            # for the caller's page (admin/callers/): the rule's row, its kind, its reset
            "rule_id": rule.id, "calendar": rule.calendar, "credits": rule.credits,
            "refill": rule.refill, "reset_s": status.reset_s, "shadow": rule.shadow,
            "numbers": (rule.rate, rule.period_s, rule.burst),
        })
    return rows, False


def _percent(status):
    """The share of the capacity left, 0 to 100. A credit balance's capacity is its allowance
    (0 for prepaid units alone), which prepaid units may exceed: shown as full."""
    if status.burst <= 0:
        return 100 if status.remaining > 0 else 0
    return min(100, round(100 * status.remaining / status.burst))


def _pace(rule, status):
    """How the rule refills: '10 per 60 s', a calendar quota's reset time, or a credit
    balance's allowance."""
    if rule.credits:
        if not rule.refill:
            return f"prepaid credits, {rule.rate} included once"
        return f"prepaid credits, {rule.rate} included per {rule.refill}"
    if not rule.calendar:
        return f"{rule.rate} per {rule.period_s} s"
    return f"{rule.rate} per {rule.calendar} (resets in {status.reset_s} s)"


def acting_keys(identity):
    """Return the API keys of ``identity``'s user when it is a user (each key is an identity of
    its own: a request with it is charged to the key's buckets, not the user's), else []."""
    if identity.kind != "user" or identity.user_id is None:
        return []
    return list(ApiKey.objects.filter(user_id=identity.user_id).select_related("user", "plan")
                .order_by("id"))


def reset_buckets(identity, snapshot, keys=None):
    """Delete the client's own bucket keys (user/key and IP scopes; shared buckets stay), and
    for a user those of its API keys (``keys``, default ``acting_keys``), and bump the config
    version so workers drop stale local denials. A prepaid credit balance is
    money, not a limit: it is never reset (a deleted one would be rebuilt from the ledger's
    last checkpoint, giving back what was spent since). Returns ``(keys deleted, new config
    version)``; raises ``StoreUnavailable``."""
    keys = acting_keys(identity) if keys is None else keys
    own = []
    for who in [identity, *[_key_identity(key, snapshot) for key in keys]]:
        own.extend(b.key for b in _client_buckets(who, snapshot) or []
                   if b.rule.scope in CLIENT_SCOPES and not b.rule.credits)
    # one identity's keys share a hash tag: one DEL per identity's slot, even on Redis Cluster
    return default_limiter().reset(list(dict.fromkeys(own)))


def reset_and_record(lookup, snapshot, user, source=""):
    """Reset the buckets of the client ``lookup`` found (``reset_buckets``: a user's with its
    API keys') and record it in the admin history as done by ``user``, from ``source`` when it
    is not the admin. Returns the message to show, which names what was not reset; raises
    ``StoreUnavailable`` (then nothing is reset or recorded)."""
    identity = lookup.identity
    keys = acting_keys(identity)
    deleted, version = reset_buckets(identity, snapshot, keys)
    with_keys = f" and of its API keys {', '.join(f'{k.prefix}…' for k in keys)}" if keys else ""
    message = f"Reset the buckets of {lookup.label}{with_keys} ({counted(deleted, 'key')} " \
              f"deleted; config version {version}).{_not_reset(identity)}"
    LogEntry.objects.create(
        user_id=user.pk, action_flag=CHANGE,
        change_message=f"{message} Done with {source}." if source else message,
        content_type=ContentType.objects.get_for_model(Dashboard, for_concrete_model=False),
        object_id=None, object_repr=f"buckets of {lookup.label}"[:200])
    return message


def _not_reset(identity):
    """The sentence naming what a reset of ``identity`` leaves alone ("" for an address)."""
    if identity.kind == "user":
        return " Not reset: the buckets of the addresses it calls from (reset each by itself)."
    if identity.kind == "key":
        return (" Not reset: its user's own buckets (resetting the user resets its keys too) "
                "and those of the addresses it calls from.")
    return ""
