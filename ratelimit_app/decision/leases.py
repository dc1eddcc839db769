"""Leases: a worker takes a batch of tokens from a hot shared bucket and spends them locally.

A global or plan bucket lives in one Redis key, so on a cluster one master sees every request.
With a lease size set on its rule, a request that finds no local tokens asks Redis for its cost
*plus* the lease in the same atomic call; the extra tokens are then spent here, request by
request, without touching that key. The bucket's node sees one call per lease instead of one per
request.

Why it never over-grants: every token spent locally was first debited in Redis, in a call that
debited all of that request's other buckets too (or none). A request that spends a local token
and is then refused by another bucket gives the token back to the local lease.

What it costs: tokens sitting in a worker's lease are out of the bucket, so other workers may be
refused while they exist (under-grant). At most ``lease`` tokens per rule per worker are out at
any moment, and a lease unspent after ``ttl_s`` is dropped (not returned: returning would need
another call; the bucket refills at its rate meanwhile). A config change (new snapshot version)
voids every lease, because the rule's numbers may have changed.
"""

import threading
import time
from typing import NamedTuple

from .buckets import Bucket

__all__ = ["LeasePlan", "Leases"]


class LeasePlan(NamedTuple):
    """How one decision uses leases. Indexes refer to the decision's buckets."""

    send: tuple      # buckets to send to the store, in order (lease requests carry cost + lease)
    sent: tuple      # index of each sent bucket among the decision's buckets
    local: tuple     # indexes served from a local lease (not sent)
    leasing: tuple   # indexes whose sent bucket also asks for a new lease


class Leases:
    """This process's leased tokens, per bucket key. Thread-safe; bounded in entries."""

    def __init__(self, ttl_s=1.0, clock=time.monotonic, max_entries=1024):
        self.ttl_s = ttl_s
        self._clock = clock
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._held = {}  # bucket id -> [tokens, expires_at, version]
        self.local_spends = 0  # requests served without their lease bucket's call

    def plan(self, buckets, version):
        """Spend local tokens where a lease covers a bucket's cost; return the LeasePlan."""
        now = self._clock()
        send, sent, local, leasing = [], [], [], []
        with self._lock:
            for i, bucket in enumerate(buckets):
                extra = lease_tokens(bucket)
                if not extra:
                    send.append(bucket)
                    sent.append(i)
                    continue
                held = self._held.get(bucket.id)
                if held and held[2] == version and held[1] > now and held[0] >= bucket.cost:
                    held[0] -= bucket.cost
                    local.append(i)
                    continue
                send.append(Bucket(bucket.rule, bucket.key, bucket.cost + extra))
                sent.append(i)
                leasing.append(i)
            self.local_spends += len(local)
        return LeasePlan(tuple(send), tuple(sent), tuple(local), tuple(leasing))

    def without_leasing(self, plan, buckets):
        """Return ``plan`` asking for no new lease (when the bucket could not spare one)."""
        return plan._replace(send=tuple(buckets[i] for i in plan.sent), leasing=())

    def settle(self, plan, buckets, allowed, version):
        """After the store answered: keep the new leases of an allowed decision, or give the
        locally spent tokens back when the decision was refused."""
        with self._lock:
            if not allowed:
                for i in plan.local:
                    held = self._held.get(buckets[i].id)
                    if held is not None:
                        held[0] += buckets[i].cost
                return
            if not plan.leasing:
                return
            expires_at = self._clock() + self.ttl_s
            for i in plan.leasing:
                bucket = buckets[i]
                if len(self._held) >= self.max_entries and bucket.id not in self._held:
                    self._drop_expired()
                    if len(self._held) >= self.max_entries:
                        continue  # no room: those tokens go unspent (under-grant only)
                # a new lease replaces what is left of the old one (expired or too small)
                self._held[bucket.id] = [lease_tokens(bucket), expires_at, version]

    def held_tokens(self):
        """Return the tokens this process holds in unexpired leases (for tests and health)."""
        now = self._clock()
        with self._lock:
            return sum(h[0] for h in self._held.values() if h[1] > now)

    def _drop_expired(self):
        now = self._clock()
        for key in [k for k, h in self._held.items() if h[1] <= now]:
            del self._held[key]


def lease_tokens(bucket):
    """Return the tokens a lease of ``bucket`` takes beyond the request's cost (0: no lease):
    the rule's lease size, never more than the burst leaves once the cost is paid."""
    rule = bucket.rule
    if not rule.lease or rule.shadow or bucket.gate:
        return 0
    return max(0, min(rule.lease, rule.burst - bucket.cost))
