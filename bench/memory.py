"""6. Memory: Redis bytes per active bucket (MEMORY USAGE), keys after N distinct identities, and
that idle keys expire (a 2 s rule, polled with a deadline)."""

import statistics
import time
from typing import NamedTuple

from ratelimit_app.decision.buckets import unpack_value
from ratelimit_app.runtime.limiter import default_limiter

from . import alternatives, naive
from .harness import table, verdict

TARGET_BYTES = 100  # per active bucket


def _identities(request, endpoint, count, offset=0):
    meta = request.META
    decide = default_limiter().decide
    for i in range(offset, offset + count):
        meta["REMOTE_ADDR"] = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        decide(request, None, endpoint)


class KeyState(NamedTuple):
    """One key as read in one transaction: its value's records, MEMORY USAGE and PTTL."""

    buckets: dict       # rule id -> (level_units, stamp_ms, period_ms)
    memory_usage: int   # bytes
    pttl_ms: int        # -1: no TTL


def read_keys(client, pattern, after_listing=None, batch=1000):
    """List the keys matching ``pattern``, then read each one's value, MEMORY USAGE and PTTL.

    Return ``(states, vanished)``: key -> KeyState for the keys still there when read, and how
    many listed keys were gone by then. A key may expire (or be rewritten) between SCAN and the
    read if the host stalls longer than its TTL: each key's three figures come from one
    MULTI/EXEC, so they describe one moment of it, and a key gone is counted, not unpacked
    (unpacking a vanished key once ended a whole run). ``after_listing(keys)`` is called
    between the two (for tests)."""
    keys = list(client.scan_iter(pattern, count=5000))
    if after_listing is not None:
        after_listing(keys)
    states, vanished = {}, 0
    for start in range(0, len(keys), batch):
        chunk = keys[start:start + batch]
        pipe = client.pipeline(transaction=True)  # one MULTI/EXEC per batch
        for key in chunk:
            pipe.get(key)
            pipe.memory_usage(key)
            pipe.pttl(key)
        replies = pipe.execute()
        for index, key in enumerate(chunk):
            value, usage, pttl = replies[index * 3:index * 3 + 3]
            if value is None or usage is None or pttl == -2:
                vanished += 1
                continue
            states[key] = KeyState(unpack_value(value)[1], usage, pttl)
    return states, vanished


def run(env, quick):
    client = env.client()
    count = 10_000 if quick else 100_000
    request = alternatives.django_request()
    client.flushall()
    base_memory = client.info("memory")["used_memory"]
    started = time.monotonic()
    _identities(request, "bench:memory", count)
    elapsed = time.monotonic() - started
    keys = client.dbsize()
    used = client.info("memory")["used_memory"] - base_memory
    rule_id = next(r.id for r in default_limiter().snapshot().rules if r.name == "anon-memory-ip")
    # every identity's key, each holding that identity's buckets (see decision/keys.py); the rule
    # keeps them an hour (bench/fixtures.py), so how many there are does not depend on how fast
    # this host filled them, and read_keys skips any that vanish anyway
    states, vanished = read_keys(client, "rl:{ip.*")
    rule_keys = sum(1 for state in states.values() if rule_id in state.buckets)
    usages = [state.memory_usage for state in states.values()]
    usage = statistics.median(usages) if usages else float("nan")
    bytes_per_bucket = sum(usages) / max(sum(len(s.buckets) for s in states.values()), 1)
    no_ttl = sum(1 for state in states.values() if state.pttl_ms < 0)

    naive.take_naive(naive.naive_keys("memory", 1), naive.naive_args(1))
    naive_usage = client.memory_usage(naive.naive_keys("memory", 1)[0])

    # idle keys vanish: 1,000 identities on a rule that is full again 2 s after one request
    client.flushall()
    _identities(request, "bench:expiry", 1000)
    created = client.dbsize()
    deadline, gone_after = time.monotonic() + 15, None
    while time.monotonic() < deadline:
        if client.dbsize() <= 1:  # at most the config version counter
            gone_after = time.monotonic() - (deadline - 15)
            break
        time.sleep(0.2)  # polling Redis's own expiry, not timing a test
    rows = [
        ["distinct identities (ip scope, 1 per 3600 s, burst 10)", count],
        ["keys in Redis afterwards (DBSIZE)", keys],
        ["buckets of that rule per identity", f"{rule_keys / count:.2f}"],
        ["keys per identity (each holds the identity's buckets: anon-ip and anon-memory-ip)",
         f"{len(states) / count:.2f}"],
        ["keys listed but gone when read (expected 0)", vanished],
        ["MEMORY USAGE per identity key, median (bytes)", usage],
        ["MEMORY USAGE per bucket (the keys' bytes ÷ the buckets they hold)",
         f"{bytes_per_bucket:.0f}"],
        ["used_memory growth per key (bytes)", f"{used / max(keys, 1):.0f}"],
        ["naive hash bucket, MEMORY USAGE (bytes)", naive_usage],
        ["keys without a TTL", no_ttl],
        ["decision rate while filling (per s, 1 thread)", f"{count / elapsed:,.0f}"],
        ["2 s rule: keys created / all gone after (s)",
         f"{created} / {gone_after:.1f}" if gone_after else f"{created} / NOT within 15 s"],
    ]
    targets = [(f"4. memory: ≤ {TARGET_BYTES} B per active bucket (MEMORY USAGE)",
                f"{bytes_per_bucket:.0f} B ({usage:.0f} B per key)",
                verdict(bytes_per_bucket <= TARGET_BYTES)),
               ("4. 0 keys left after the idle TTL (2 s rule, no key without TTL)",
                f"{gone_after:.1f} s" if gone_after else "keys left after 15 s",
                verdict(gone_after is not None and no_ttl == 0))]
    return {"title": "6. Memory", "markdown": table(["measure", "value"], rows),
            "ratios": {"memory.bytes_per_bucket": bytes_per_bucket},
            "results": {"identities": count, "keys": keys, "rule_keys": rule_keys,
                        "bytes_per_bucket": bytes_per_bucket, "bytes_per_key": usage,
                        "used_memory_per_key": used / max(keys, 1), "naive_bytes": naive_usage,
                        "no_ttl": no_ttl, "vanished_before_read": vanished,
                        "expired_after_s": gone_after},
            "targets": targets}
