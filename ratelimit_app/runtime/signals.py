"""Bump the config version in Redis after every committed change of quota rows.

Workers compare the version with their snapshot's and reload, so an admin edit is enforced
everywhere within about a second without a restart. One transaction is one bump at its commit,
however many rows it changed (``commit_hooks.on_commit_once``): an admin save with its inlines,
an import, or ``loaddata`` of a whole fixture (its saves send ``post_save`` with ``raw=True``,
all in one transaction) makes every worker reload once, not once per row. After ``migrate``
has applied migrations (a data migration edits rows without signals) the version is bumped
once. What sends no signal at all (a queryset's ``update()``, ``bulk_create``, raw SQL) is
found by the workers' comparison of the rows (``policy.PolicyCache``, every
``CONFIG_RELOAD_INTERVAL_S``).
"""

import logging
import sys

from django.apps import apps
from django.contrib.auth.signals import user_login_failed
from django.db.models.signals import post_delete, post_migrate, post_save

from ..config import audit
from ..config.changes import add_row
from ..config.commit_hooks import on_commit_once, waiting_for_commit
from ..config.compiler import config_models
from ..stores import StoreUnavailable
from . import guard
from .limiter import default_limiter

logger = logging.getLogger("ratelimit_app")

# the tables the snapshot is compiled from (and the fingerprint covers)
WATCHED_MODELS = config_models()


def bump_config_version(parts=None):
    """Tell every worker to reload (logged, not raised, if Redis is down: workers poll again).
    ``parts``: the tables or rows changed, as ``config/changes.py`` writes them (None: unknown).

    This process reloads at once; the others within CONFIG_WATCH_INTERVAL_S, and no debit is
    made on the old rules meanwhile (the fence, see config/policy.py).
    """
    limiter = default_limiter()
    try:
        limiter.bump_config_version(parts)
    except StoreUnavailable as exc:
        logger.error("ratelimit_app: config change not announced, Redis unavailable: %s", exc)


class _Announcement:
    """The commit callback of one transaction: a new version naming the rows it changed (each
    worker then reads those rows alone; a table whose rows are too many to name, whole).
    Dropped with its transaction when that rolls back, like any commit callback."""

    def __init__(self):
        self.parts = set()

    def __call__(self):
        bump_config_version(self.parts)


def _on_change(sender, using=None, **kwargs):
    # once per transaction, however many rows it changed (an admin save with its inlines, an
    # import, loaddata of a whole fixture): one audit entry and one new version at the commit
    row = (sender._meta.concrete_model._meta.model_name,
           getattr(kwargs.get("instance"), "pk", None))
    audit.note_change(using, *row)
    waiting = waiting_for_commit("config-version", using)
    if waiting is not None:
        add_row(waiting.parts, *row)
    else:
        announcement = _Announcement()
        add_row(announcement.parts, *row)  # before: outside a transaction it runs at once
        on_commit_once("config-version", announcement, using=using)


def _senders():
    """Return the watched models and every installed proxy of one: a save through a proxy is
    sent as the proxy (the index's group apps edit API keys, plan assignments and overrides
    through proxies, ratelimit_app/groups/)."""
    return [model for model in apps.get_models() if model._meta.concrete_model in WATCHED_MODELS]


for model in _senders():
    post_save.connect(_on_change, sender=model,
                      dispatch_uid=f"ratelimit_app.save.{model._meta.label}")
    post_delete.connect(_on_change, sender=model,
                        dispatch_uid=f"ratelimit_app.delete.{model._meta.label}")


def _on_migrate(sender, app_config=None, plan=None, **kwargs):
    # sent once per installed app after every migrate: answer for this app only, and only when
    # migrations ran (a data migration of any app may have changed quota rows without a signal;
    # ``flush`` sends it with no plan)
    if app_config is None or app_config.name != "ratelimit_app":
        return
    if plan:
        bump_config_version()
        _record_baseline(kwargs.get("using"))
    _import_drf_rates(kwargs.get("using") or "default", kwargs.get("verbosity", 1),
                      kwargs.get("stdout") or sys.stdout)


def _import_drf_rates(using, verbosity, stdout):
    """DRF's DEFAULT_THROTTLE_RATES as plans and rules, into an empty configuration, once
    (``config/drf_rates.py`` says why on migrate)."""
    from ..config.drf_rates import import_drf_rates

    try:
        created, problems = import_drf_rates(using)
    except Exception:  # never fail a migrate over it: the rates can be entered in the admin
        logger.exception("ratelimit_app: could not import DRF's DEFAULT_THROTTLE_RATES")
        return
    if not verbosity:
        return
    for problem in problems:
        stdout.write(f"  ratelimit_app: {problem}\n")
    if created:  # the rows' saves announced the change to the workers, as any save does
        stdout.write(f"  ratelimit_app: DRF's DEFAULT_THROTTLE_RATES imported as "
                     f"{len(created)} rules ({', '.join(rule.name for rule in created)}): "
                     f"see them in the admin, under Rate limits\n")


def _record_baseline(using):
    """Give an empty audit trail its first entry: the configuration as the migrations left it,
    so the first real change shows only itself."""
    from ..config.models import AuditEntry, AuditSource

    try:
        if not AuditEntry.objects.using(using).exists():
            audit.record(audit.Actor("migrate", AuditSource.MIGRATE), baseline=True)
    except Exception:  # e.g. migrated backwards past the table: nothing to record into
        logger.exception("ratelimit_app: could not record the audit trail's first entry")


post_migrate.connect(_on_migrate, dispatch_uid="ratelimit_app.migrated")


def _on_login_failed(sender, credentials=None, request=None, **kwargs):
    # Django's authenticate() (login forms, DRF's BasicAuthentication) reports wrong passwords
    # here; the failure is charged to the client IP once the response is ready (guard.py)
    guard.mark_authentication_failed(request)


user_login_failed.connect(_on_login_failed, dispatch_uid="ratelimit_app.login_failed")
