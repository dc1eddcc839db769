"""The record of the penalty box's bans: a ``Ban`` row per ban (or would-be ban of a shadow
rule), an audit entry per ban imposed or lifted. The bans themselves live in Redis
(protection/bans.py); these rows are what staff see and act on."""

import datetime

from django.utils import timezone

from .audit import Actor, record_event
from .models import AuditSource, Ban

__all__ = ["record_bans", "record_lift", "current_bans"]


def _moment(ms):
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def record_bans(outcomes, *, shadow_outcome):
    """Record each new ban (and would-be ban) among ``outcomes`` (protection.bans.BanOutcome);
    return the Ban rows. ``shadow_outcome`` is the outcome code of a would-be ban."""
    rows = []
    for outcome in outcomes:
        rule, identity = outcome.rule, outcome.identity
        shadow = outcome.outcome == shadow_outcome
        ban = Ban.objects.create(
            rule_id=rule.id, rule_name=rule.name, scope=rule.scope,
            who=(identity.display if rule.scope != "ip" else identity.ip)[:200],
            key=outcome.key, since=_moment(outcome.at_ms), until=_moment(outcome.until_ms),
            times=outcome.times, shadow=shadow)
        seconds = (outcome.until_ms - outcome.at_ms) // 1000
        verb = "would have banned" if shadow else "banned"
        record_event(Actor("penalty box", AuditSource.PENALTY_BOX),
                     f"{rule.name} {verb} {ban.who} for {seconds} s (ban {ban.times} within "
                     f"its memory)")
        rows.append(ban)
    return rows


def record_lift(ban, actor):
    """Mark ``ban`` (a Ban row) lifted by ``actor`` (an audit Actor) now, and audit it."""
    ban.lifted_at, ban.lifted_by = timezone.now(), actor.name[:150]
    ban.save(update_fields=["lifted_at", "lifted_by"])
    record_event(actor, f"lifted the ban of {ban.who} by {ban.rule_name}")


def current_bans(now=None):
    """Return the bans in force now (not shadow, not lifted, not ended), latest first."""
    now = now or timezone.now()
    return Ban.objects.filter(shadow=False, lifted_at=None, until__gt=now)
