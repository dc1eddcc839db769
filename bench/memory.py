"""6. Memory: Redis bytes per active bucket (MEMORY USAGE), keys after N distinct identities, and
that idle keys expire (a 2 s rule, polled with a deadline)."""

import statistics
import time

from ratelimit_app.buckets import unpack_value
from ratelimit_app.limiter import default_limiter

from . import alternatives, naive
from .harness import table, verdict

TARGET_BYTES = 100  # per active bucket


def _identities(request, endpoint, count, offset=0):
    meta = request.META
    decide = default_limiter().decide
    for i in range(offset, offset + count):
        meta["REMOTE_ADDR"] = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        decide(request, None, endpoint)


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
    rule_id = next(r.id for r in default_limiter().snapshot().rules if r.name == "anon-memory-ip")
    ip_keys = list(client.scan_iter("rl:{ip.*", count=5000))
    # buckets of that rule: one record in each identity's key (see keys.py)
    rule_keys = sum(1 for k in ip_keys if rule_id in unpack_value(client.get(k) or b"")[1])
    used = client.info("memory")["used_memory"] - base_memory
    sample = ip_keys[:200]
    usages = [client.memory_usage(k) for k in sample]
    usage = statistics.median(usages)
    buckets_in_sample = sum(len(unpack_value(client.get(k))[1]) for k in sample)
    bytes_per_bucket = sum(usages) / max(buckets_in_sample, 1)
    no_ttl = sum(1 for k in sample if client.pttl(k) < 0)

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
        ["distinct identities (ip scope, 1 per 60 s, burst 10)", count],
        ["keys in Redis afterwards (DBSIZE, incl. expired ones not yet reclaimed)", keys],
        ["buckets of that rule per identity", f"{rule_keys / count:.2f}"],
        ["keys per identity (each holds the identity's buckets: anon-ip and anon-memory-ip)",
         f"{len(ip_keys) / count:.2f}"],
        ["MEMORY USAGE per identity key, median (bytes)", usage],
        ["MEMORY USAGE per bucket (sampled keys' bytes ÷ the buckets they hold)",
         f"{bytes_per_bucket:.0f}"],
        ["used_memory growth per key (bytes)", f"{used / max(keys, 1):.0f}"],
        ["naive hash bucket, MEMORY USAGE (bytes)", naive_usage],
        ["sampled keys without a TTL", no_ttl],
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
                        "no_ttl": no_ttl, "expired_after_s": gone_after},
            "targets": targets}
