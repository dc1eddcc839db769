"""Who a caller's page is about, and where its plan comes from.

The caller is found as the inspector finds it (``dashboard.inspector.find_identity``): its
identity is the one its real requests get, so the plan shown is the plan they are limited by.
``plan_source`` then says which row gave that plan: the API key's own plan, the user's plan
assignment, or the default plan (for signed-in or anonymous callers).
"""

import dataclasses

from django.contrib.auth import get_user_model

from ...config.models import ApiKey, Plan, PlanAssignment
from ..placement import admin_url_name
from .links import admin_url

__all__ = ["Caller", "caller_of", "PlanSource", "plan_source"]


@dataclasses.dataclass
class Caller:
    """One caller: ``identity`` as its requests get it, and the rows behind it (``api_key``
    for a key, ``user`` for a key or a user; neither for an address)."""

    identity: object
    label: str
    api_key: object = None
    user: object = None

    @property
    def ref(self):
        return self.identity.ref

    @property
    def kind(self):
        return self.identity.kind

    @property
    def has_history(self):
        """Keys and users have an hourly history; addresses never do (caller_history.py)."""
        return self.kind in ("key", "user")


def caller_of(lookup):
    """Return the Caller of a ``Lookup`` that found one identity."""
    identity = lookup.identity
    api_key = user = None
    if identity.kind == "key":
        api_key = ApiKey.objects.select_related("user", "plan").filter(
            pk=identity.api_key_id).first()
        user = api_key.user if api_key else None
    elif identity.kind == "user":
        user = get_user_model().objects.filter(pk=identity.user_id).first()
    return Caller(identity, lookup.label, api_key, user)


@dataclasses.dataclass(frozen=True)
class PlanSource:
    """The caller's plan (``slug``, ``name``, ``url`` of its page) and where it comes from:
    ``source`` one of "key", "assignment", "default", "resolver", "none", said in ``words``
    with the row's page at ``source_url``; ``note`` says what else a reader should know."""

    slug: str
    name: str
    url: str
    source: str
    words: str
    source_url: str = ""
    note: str = ""


def _change_url(model, pk):
    return admin_url(admin_url_name(model, "change"), pk)


def plan_source(caller, snapshot):
    """Return the :class:`PlanSource` of ``caller`` under the policy ``snapshot``."""
    slug = caller.identity.plan
    plan = Plan.objects.filter(slug=slug).first() if slug else None
    name, url = (plan.name, _change_url(Plan, plan.pk)) if plan else (slug or "", "")
    if not slug:
        return PlanSource("", "", "", "none", "no plan: only the rules for every plan apply")
    if caller.kind == "anonymous":
        return _defaulted(slug, name, url, snapshot.default_anonymous_plan,
                          "the default plan for anonymous callers")
    note = ""
    if caller.api_key is not None:
        entry = snapshot.api_keys.get(caller.api_key.digest)
        key_plan = entry.plan if entry else None
        if key_plan and key_plan == slug:
            return PlanSource(slug, name, url, "key", "the API key's own plan",
                              _change_url(ApiKey, caller.api_key.pk))
        if caller.api_key.plan_id:
            note = (f"The key's own plan ({caller.api_key.plan}) is not in force now "
                    f"(outside its dates, or the key is revoked).")
    assignment = snapshot.assignments.get(caller.identity.user_id or "")
    if assignment and assignment[0] == slug:
        row = PlanAssignment.objects.filter(user_id=caller.identity.user_id).first()
        words = "its user's plan assignment" if caller.kind == "key" else "its plan assignment"
        return PlanSource(slug, name, url, "assignment", words,
                          _change_url(PlanAssignment, row.pk) if row else "", note)
    source = _defaulted(slug, name, url, snapshot.default_authenticated_plan,
                        "the default plan for signed-in callers")
    return dataclasses.replace(source, note=note)


def _defaulted(slug, name, url, default, words):
    if slug == default:
        return PlanSource(slug, name, url, "default", words)
    # PLAN_RESOLVER gave another plan to the page's synthetic request
    return PlanSource(slug, name, url, "resolver", "the project's PLAN_RESOLVER",
                      note="PLAN_RESOLVER decides per request: a real request may get another.")

