"""Rolling the usage counts up from Redis into the database (UsageRecord rows), off the request
path: ``manage.py ratelimit rollup`` (a cron, or ``--every`` as its own process).

Exactly once, whatever crashes where. The workers' flushes add to one pending hash with
HINCRBY. A rollup

1. claims it: one script RENAMEs the pending hash to ``claimed:<batch id>`` and adds the id to
   the claims set (atomic: flushes after it start a new pending hash, none is lost);
2. for every claimed batch (its own, and any a crashed rollup left), in ONE transaction, inserts
   a RollupBatch row with the batch id (unique) and adds the counts into the UsageRecord rows
   (F() increments, new rows created);
3. deletes the claimed hash and its claim.

A crash before the commit leaves the claim: the next rollup adds it. A crash between the commit
and the delete leaves the claim too, but its RollupBatch row says it was added: the next rollup
only deletes it. Two rollups at once: the unique batch id lets one transaction add a batch;
the other's insert fails (on PostgreSQL it waits for the first to commit) and it moves on.
"""

import datetime
import logging
import uuid
from collections import defaultdict
from typing import NamedTuple

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from ...conf import get_config
from ...metrics import fields
from ...metrics.usage import USAGE_METRICS
from .models import RollupBatch, UsageRecord

__all__ = ["RollupResult", "UsageRollup", "BATCHES_KEPT_DAYS"]

logger = logging.getLogger("ratelimit_app")

# RollupBatch rows are needed only while their claimed hash may still be in Redis: it expires
# with the pending hash's TTL (flush.USAGE_PENDING_TTL_S, 30 days), which RENAME keeps.
BATCHES_KEPT_DAYS = 31

# KEYS: the pending hash, the claimed hash to create, the claims set. ARGV: the batch id.
# Returns 1 if there was something to claim.
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
"""


class RollupResult(NamedTuple):
    """What one rollup did: batches added to the database, batches found added already (only
    deleted from Redis), and usage records created or added to."""

    batches: int
    already_added: int
    records: int


class UsageRollup:
    """Rolls the usage counts of the store ``client`` (a redis-py client: a Limiter's
    ``store.metrics_client()``) into UsageRecord rows. ``crash_after_commit`` is for tests: a
    callable run between a batch's commit and its deletion from Redis."""

    def __init__(self, client, prefix=None, *, crash_after_commit=None):
        self.client = client
        self.prefix = prefix or get_config()["KEY_PREFIX"]
        self._claim = client.register_script(_CLAIM)
        self._crash_after_commit = crash_after_commit

    def run(self):
        """Claim the pending counts and add every claimed batch into the database. Returns a
        RollupResult."""
        batch_id = uuid.uuid4().hex
        self._claim(keys=[fields.usage_pending_key(self.prefix),
                          fields.usage_claimed_key(self.prefix, batch_id),
                          fields.usage_claims_key(self.prefix)], args=[batch_id])
        claims = sorted(fields.decode(c) for c in
                        self.client.smembers(fields.usage_claims_key(self.prefix)))
        batches = already = records = 0
        for claimed in claims:
            added = self._add_batch(claimed)
            if added is None:
                already += 1
            else:
                batches += 1
                records += added
            if self._crash_after_commit is not None:
                self._crash_after_commit()
            self._forget(claimed)
        RollupBatch.objects.filter(rolled_up_at__lt=timezone.now() - datetime.timedelta(
            days=BATCHES_KEPT_DAYS)).delete()
        return RollupResult(batches, already, records)

    def _add_batch(self, batch_id):
        """Add one claimed batch into the records in one transaction. Returns the number of
        records it touched, or None if the batch had been added before."""
        raw = self.client.hgetall(fields.usage_claimed_key(self.prefix, batch_id))
        counts = _parse(raw)
        try:
            with transaction.atomic():
                # first: a concurrent rollup of the same batch waits here, then fails
                RollupBatch.objects.create(batch_id=batch_id, records=len(counts))
                for key, numbers in counts.items():
                    _add_record(key, numbers)
        except IntegrityError:
            if RollupBatch.objects.filter(batch_id=batch_id).exists():
                return None
            raise
        return len(counts)

    def _forget(self, batch_id):
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(fields.usage_claimed_key(self.prefix, batch_id))
        pipe.srem(fields.usage_claims_key(self.prefix), batch_id)
        pipe.execute()


def _parse(raw):
    """Return ``{(day, ref, tenant, rule): {"units": n, ..., "display": text}}`` of a claimed
    hash's fields (unreadable fields are logged and skipped)."""
    counts = defaultdict(lambda: dict.fromkeys(USAGE_METRICS, 0))
    for field, value in raw.items():
        parsed = fields.parse_usage_field(field)
        if parsed is None or parsed[5] not in USAGE_METRICS:
            logger.warning("ratelimit_app: skipped an unreadable usage field %.80r", field)
            continue
        day, ref, tenant, rule, display, metric = parsed
        try:
            day = datetime.date.fromisoformat(day)
        except ValueError:
            logger.warning("ratelimit_app: skipped a usage field with day %.20r", day)
            continue
        numbers = counts[(day, ref, tenant, rule)]
        numbers[metric] += int(value)
        numbers["display"] = display
    return dict(counts)


def _add_record(key, numbers):
    """Add ``numbers`` to the UsageRecord of ``key``, creating it if there is none (inside the
    caller's transaction; a savepoint catches a concurrent creation of the same row)."""
    day, ref, tenant, rule = key
    lookup = {"day": day, "identity": ref[:150], "tenant": tenant[:150], "rule": rule[:64]}
    increments = {metric: F(metric) + numbers[metric] for metric in USAGE_METRICS}
    display = numbers.get("display", "")[:200]
    if UsageRecord.objects.filter(**lookup).update(display=display, **increments):
        return
    try:
        with transaction.atomic():
            UsageRecord.objects.create(display=display, **lookup,
                                       **{metric: numbers[metric] for metric in USAGE_METRICS})
    except IntegrityError:  # created meanwhile by a rollup of another batch
        UsageRecord.objects.filter(**lookup).update(display=display, **increments)
