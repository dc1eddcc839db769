"""The record of the penalty box's bans, bounded whatever the number of callers.

The bans themselves live in Redis (protection/bans.py), exact per caller; the database gets
what staff see and act on, written off the request path by a background thread
(business/alerts/bans.py), in an amount no client controls:

- the ban log (``BanLogEntry``): one ``banned`` entry per ban rule, mode and interval of
  BAN_LOG_INTERVAL_S, counting that interval's bans and listing the first few callers; one
  ``lifted`` entry per lift by staff. The audit trail keeps to configuration changes.
- a ``Ban`` row for at most BAN_ROWS_PER_INTERVAL of a rule's bans per interval: what the
  admin, the dashboard and ``manage.py ratelimit bans`` list and lift. The others are counted
  in the log entry and refused by Redis all the same.

A ban whose retries extend it (a rule with ``extend_on_retry``) moves its row's ``until``
(``extend_bans``): the thread writes each row's latest end once per round, not once per retry.
"""

import datetime

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from .models import Ban, BanLogEntry, BanLogKind, BanRule

__all__ = ["record_bans", "extend_bans", "record_lift", "current_bans",
           "unlisted_bans", "ban_log"]

# rows read per query when moving extended bans' ends (a bound on a query's parameters)
_KEYS_PER_QUERY = 500


def moment(ms):
    """Return the aware datetime of ``ms`` milliseconds since the epoch."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)


def record_bans(tally, rows_per_interval):
    """Add ``tally`` (business.alerts.bans.BanTally) to its ban-log entry, made by the first
    tally of its rule, mode and interval, and make a Ban row for each listed ban while the
    interval has fewer than ``rows_per_interval``. Returns ``(entry, made)``: the entry, and
    whether this call made it; ``(None, False)`` when the rule was deleted meanwhile (its bans
    end in Redis on their own). Runs in the caller's transaction (its deliveries go with it)."""
    if not BanRule.objects.filter(pk=tally.rule_id).exists():
        return None, False
    key = {"kind": BanLogKind.BANNED, "rule_id": tally.rule_id, "shadow": tally.shadow,
           "interval_start": moment(tally.interval_start_ms)}
    made = False
    try:
        with transaction.atomic():  # a savepoint: a duplicate rolls back only itself
            BanLogEntry.objects.create(**key, rule_name=tally.rule_name, scope=tally.scope,
                                       at=moment(tally.interval_start_ms))
            made = True
    except IntegrityError:
        pass  # another worker made it: add to it
    # write first, then read: the no-op UPDATE locks the entry on any database, so writers of
    # one rule and interval take turns and the rows stay within their bound
    BanLogEntry.objects.filter(**key).update(bans=F("bans"))
    entry = BanLogEntry.objects.get(**key)
    room = max(0, rows_per_interval - len(entry.callers))
    listed = tally.listed[:room]
    Ban.objects.bulk_create([
        Ban(rule_id=tally.rule_id, rule_name=tally.rule_name, scope=tally.scope,
            who=ban.who, key=ban.key, since=moment(ban.since_ms), until=moment(ban.until_ms),
            times=ban.times, shadow=tally.shadow)
        for ban in listed])
    entry.callers = entry.callers + [
        {"who": ban.who, "since": moment(ban.since_ms).isoformat(),
         "until": moment(ban.until_ms).isoformat(), "times": ban.times} for ban in listed]
    entry.bans += tally.bans
    latest = max(ban.since_ms for ban in tally.listed) if tally.listed else None
    if latest is not None and moment(latest) > entry.at:
        entry.at = moment(latest)
    entry.save(update_fields=["callers", "bans", "at"])
    return entry, made


def extend_bans(ends):
    """Move the ``until`` of the Ban rows in force of ``ends`` (``{(rule id, key): until
    ms}``, the latest end Redis gave each extended ban) to those ends. Returns how many rows
    moved."""
    moved = []
    by_rule = {}
    for (rule_id, key), until_ms in ends.items():
        by_rule.setdefault(rule_id, {})[key] = until_ms
    for rule_id, keys in by_rule.items():
        names = list(keys)
        for start in range(0, len(names), _KEYS_PER_QUERY):
            rows = Ban.objects.filter(rule_id=rule_id, key__in=names[start:start + _KEYS_PER_QUERY],
                                      shadow=False, lifted_at=None)
            for ban in rows:
                until = moment(keys[ban.key])
                if until > ban.until:
                    ban.until = until
                    moved.append(ban)
    Ban.objects.bulk_update(moved, ["until"])
    return len(moved)


def record_lift(ban, actor):
    """Mark ``ban`` (a Ban row) lifted by ``actor`` (an audit Actor) now, and log the lift in
    the ban log. Returns the log entry."""
    now = timezone.now()
    with transaction.atomic():
        ban.lifted_at, ban.lifted_by = now, actor.name[:150]
        ban.save(update_fields=["lifted_at", "lifted_by"])
        return BanLogEntry.objects.create(
            kind=BanLogKind.LIFTED, at=now, rule_id=ban.rule_id, rule_name=ban.rule_name,
            scope=ban.scope, bans=1, who=ban.who, actor=actor.name[:150])


def current_bans(now=None):
    """Return the bans in force now (not shadow, not lifted, not ended), latest first."""
    now = now or timezone.now()
    return Ban.objects.filter(shadow=False, lifted_at=None, until__gt=now)


def unlisted_bans(since):
    """Return the ban-log entries since ``since`` (a datetime) that counted more bans than they
    have rows for (not shadow), latest first: ``(entry, bans without a row)`` pairs."""
    entries = BanLogEntry.objects.filter(kind=BanLogKind.BANNED, shadow=False,
                                         interval_start__gte=since)
    return [(entry, entry.bans - len(entry.callers)) for entry in entries
            if entry.bans > len(entry.callers)]


def ban_log(limit=50):
    """Return the latest ``limit`` ban-log entries (bans per rule and interval, and lifts)."""
    return BanLogEntry.objects.all()[:limit]
