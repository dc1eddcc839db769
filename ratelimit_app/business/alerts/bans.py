"""The penalty box's bans, written off the request path and bounded per rule and interval.

A ban lives in Redis (protection/bans.py), exact per caller. On the request path, ``BanLog.note``
only adds the outcomes of ``ban.lua`` to this process's tallies: per ban rule, mode and interval
(BAN_LOG_INTERVAL_S) a count and the first BAN_ROWS_PER_INTERVAL callers; per extended ban its
latest end. The log's thread (every ALERTS_DRAIN_INTERVAL_S, or woken by a ban) writes them
(config/ban_records.py): one ban-log entry per rule, mode and interval, at most
BAN_ROWS_PER_INTERVAL Ban rows, one ``caller.banned`` delivery per subscribed endpoint (none for
a shadow rule) and one log line per round, whatever the number of addresses banned.

The delivery leaves at the interval's end and is rewritten by each later write until a sender
takes it, so that it says how many callers the rule banned in the interval. Its body keeps the
fields of a single ban (the first one's) and adds ``bans`` and ``callers`` (see
docs/howto/receive-webhooks.md).
"""

import atexit
import datetime
import json
import logging
import threading
import weakref
from typing import NamedTuple

from django.db import transaction

from ...process.background import WorkerThread
from .drains import drain_at_exit, drain_logged
from .webhooks import _iso, first_attempt_times

__all__ = ["BanLog", "BanTally", "ListedBan", "ban_body"]

logger = logging.getLogger("ratelimit_app")

# Extended bans whose new end a process holds between rounds (their keys come from request
# input): past this many, further ones are not noted until the next round (Redis enforces them
# anyway; a row's end catches up at the ban's next retry after that round).
MAX_EXTENSIONS_PENDING = 10_000


class ListedBan(NamedTuple):
    """One caller's ban as it may be listed: who, its Redis key, its start and end (ms), the
    bans within its rule's memory."""

    who: str
    key: str
    since_ms: int
    until_ms: int
    times: int


class BanTally(NamedTuple):
    """One ban rule's bans (or would-be bans) in one interval that a process saw: how many,
    and the first few (``listed``, at most BAN_ROWS_PER_INTERVAL)."""

    rule_id: int
    rule_name: str
    scope: str
    shadow: bool
    interval_start_ms: int
    bans: int
    listed: tuple


class BanLog:
    """This process's bans waiting to be written, and the thread that writes them.

    ``note`` runs on the request path (no database, no Redis); ``drain`` (the thread; tests call
    it directly) writes what was noted. While the database fails, what was noted stays, still
    bounded: a tally per rule, mode and interval, and MAX_EXTENSIONS_PENDING ends.
    """

    def __init__(self, config, *, autostart=True, drain_at_exit=None):
        self.config = config  # callable: the RATELIMIT_APP mapping
        self.autostart = autostart
        self._tallies = {}      # (rule id, shadow, interval start ms) → [bans, [ListedBan]]
        self._rule_names = {}   # the same key → (rule name, scope)
        self._ends = {}         # (rule id, key) → latest until ms of an extended ban
        self._lock = threading.Lock()
        self._drain_lock = threading.Lock()
        self._thread = WorkerThread(self._drain_logged, "ratelimit-bans",
                                    every_s=lambda: self.config()["ALERTS_DRAIN_INTERVAL_S"],
                                    final_round=True)
        if autostart if drain_at_exit is None else drain_at_exit:
            atexit.register(_drain_at_exit, weakref.ref(self))

    def note(self, outcomes, *, shadow_outcome, extended_outcome):
        """Note ``outcomes`` (protection.bans.BanOutcome) of new bans, would-be bans (outcome
        ``shadow_outcome``) and bans extended by a retry (``extended_outcome``)."""
        config = self.config()
        interval_ms = max(1, int(config["BAN_LOG_INTERVAL_S"])) * 1000
        listed_most = int(config["BAN_ROWS_PER_INTERVAL"])
        with self._lock:
            for outcome in outcomes:
                rule = outcome.rule
                if outcome.outcome == extended_outcome:
                    slot = (rule.id, outcome.key)
                    if slot in self._ends or len(self._ends) < MAX_EXTENSIONS_PENDING:
                        self._ends[slot] = max(self._ends.get(slot, 0), outcome.until_ms)
                    continue
                shadow = outcome.outcome == shadow_outcome
                start_ms = outcome.at_ms - outcome.at_ms % interval_ms
                slot = (rule.id, shadow, start_ms)
                tally = self._tallies.setdefault(slot, [0, []])
                self._rule_names[slot] = (rule.name, rule.scope)
                tally[0] += 1
                if len(tally[1]) < listed_most:
                    identity = outcome.identity
                    who = identity.ip if rule.scope == "ip" else identity.display
                    tally[1].append(ListedBan(str(who)[:200], outcome.key, outcome.at_ms,
                                              outcome.until_ms, outcome.times))
        if self.autostart:
            self._thread.wake()

    def pending(self):
        """Return how many tallies and extended bans wait to be written."""
        return len(self._tallies) + len(self._ends)

    def drain(self):
        """Write what was noted: the tallies (log entries, Ban rows, deliveries), then the
        extended bans' ends. Returns the ban-log entries this call made. On a database error
        what was not written is kept and the error raised."""
        with self._drain_lock:
            with self._lock:
                tallies, self._tallies = self._tallies, {}
                names, self._rule_names = self._rule_names, {}
                ends, self._ends = self._ends, {}
            made = []
            try:
                while tallies:
                    slot, (bans, listed) = next(iter(tallies.items()))
                    rule_name, scope = names[slot]
                    entry = self._write(BanTally(slot[0], rule_name, scope, slot[1], slot[2],
                                                 bans, tuple(listed)))
                    if entry is not None:
                        made.append(entry)
                    del tallies[slot]
                if ends:
                    from ...config.ban_records import extend_bans

                    extend_bans(ends)
                    ends = {}
            except Exception:
                self._keep(tallies, names, ends)
                raise
            return made

    def _write(self, tally):
        # (the models: imported late, as the runtime imports this module before Django's apps)
        from ...config.ban_records import record_bans

        config = self.config()
        with transaction.atomic():
            entry, made = record_bans(tally, int(config["BAN_ROWS_PER_INTERVAL"]))
            if entry is None:
                logger.warning("ratelimit_app: %d ban(s) by %s not logged: the rule was deleted",
                               tally.bans, tally.rule_name)
                return None
            if not tally.shadow:
                _deliver(entry, made, int(config["BAN_LOG_INTERVAL_S"]))
        verb = "would have banned" if tally.shadow else "banned"
        first = tally.listed[0].who if tally.listed else "?"
        logger.warning("ratelimit_app: %s %s %d caller(s) (first %s); %d in its interval so far",
                       tally.rule_name, verb, tally.bans, first, entry.bans)
        return entry if made else None

    def _keep(self, tallies, names, ends):
        """Put back what a failed drain did not write (merged with what was noted since)."""
        listed_most = int(self.config()["BAN_ROWS_PER_INTERVAL"])
        with self._lock:
            for slot, (bans, listed) in tallies.items():
                tally = self._tallies.setdefault(slot, [0, []])
                tally[0] += bans
                tally[1] = (listed + tally[1])[:listed_most]
                self._rule_names[slot] = names[slot]
            for slot, until_ms in ends.items():
                if slot in self._ends or len(self._ends) < MAX_EXTENSIONS_PENDING:
                    self._ends[slot] = max(self._ends.get(slot, 0), until_ms)

    def _drain_logged(self):
        drain_logged(self, "bans not written yet")

    def stop(self):
        """Stop the thread, after a last drain (what it cannot write stays noted)."""
        self._thread.stop()


def _drain_at_exit(log_ref):
    drain_at_exit(log_ref, "ban tally(ies)")


def ban_body(entry, interval_s):
    """Return the JSON text of a ``caller.banned`` delivery of ``entry`` (a ``banned``
    BanLogEntry): the first ban's fields, as one ban's delivery had them, and every ban of the
    rule in the interval (``bans``: how many; ``callers``: the first few)."""
    first = entry.callers[0] if entry.callers else {}
    end = entry.interval_start + datetime.timedelta(seconds=interval_s)
    return json.dumps({
        "type": "caller.banned",
        "id": f"banlog_{entry.pk}",
        "created": _iso(entry.interval_start),
        "data": {
            "rule": entry.rule_name, "scope": entry.scope,
            "identity": first.get("who"), "since": _iso_text(first.get("since")),
            "until": _iso_text(first.get("until")), "times": first.get("times"),
            "interval_start": _iso(entry.interval_start), "interval_end": _iso(end),
            "bans": entry.bans,
            "callers": [{"identity": caller["who"], "since": _iso_text(caller["since"]),
                         "until": _iso_text(caller["until"]), "times": caller["times"]}
                        for caller in entry.callers],
        },
    }, separators=(",", ":"))


def _iso_text(text):
    return None if text is None else _iso(datetime.datetime.fromisoformat(text))


def _deliver(entry, made, interval_s):
    """Queue one ``caller.banned`` delivery of ``entry`` per subscribed endpoint when the entry
    was just ``made`` (sent at its interval's end); else rewrite those not taken yet."""
    from .models import DeliveryStatus, Event, WebhookDelivery, WebhookEndpoint

    body = ban_body(entry, interval_s)
    if not made:
        WebhookDelivery.objects.filter(ban_entry=entry, status=DeliveryStatus.PENDING,
                                       attempts=0).update(body=body)
        return
    end_s = entry.interval_start.timestamp() + interval_s
    next_at, give_up_at = first_attempt_times(now_s=end_s)
    WebhookDelivery.objects.bulk_create([
        WebhookDelivery(endpoint=endpoint, ban_entry=entry, event=Event.CALLER_BANNED,
                        body=body, next_attempt_at=next_at, give_up_at=give_up_at)
        for endpoint in WebhookEndpoint.objects.filter(enabled=True)
        if Event.CALLER_BANNED in endpoint.event_list()])

