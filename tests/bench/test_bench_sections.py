"""make bench's sections: one that raises is reported as failed while the others still run and
their JSON is written; the memory section reads a key that vanished or changed between listing
and reading without failing; the ASGI async view's target is ours over ours' take.lua call
alone, whose run sits next to ours'."""

import json

import pytest

from bench import run as bench_run
from bench.http_throughput import ASGI_VIEWS, LABELS, ROUND_GROUPS, asgi_ratios, round_order
from bench.memory import read_keys
from ratelimit_app.decision.buckets import pack_value, unpack_value


class SuiteEnvironment:
    """What bench/run.py needs of its Environment, on the suite's redis-server."""

    def __init__(self, redis_server):
        self.redis = redis_server

    def start(self):
        return self

    def stop(self):
        pass

    def client(self):
        return self.redis.client()

    def reset_redis(self):
        self.client().flushall()


def section(number, key):
    """A section that writes ``key`` to Redis and reports one met target."""
    def run(env, quick):
        env.client().set(key, b"1", ex=60)
        return {"title": f"{number}. {key}", "markdown": f"{key} ran",
                "results": {"keys": env.client().dbsize()},
                "targets": [(f"{number}. {key} target", "1×", "met")]}
    return run


def failing_memory(env, quick):
    unpack_value(b"")  # what a vanished key once did to a whole run: struct.error


def run_bench(argv, sections, redis_server, tmp_path):
    status = bench_run.main(argv, sections=sections,
                            environment=lambda: SuiteEnvironment(redis_server),
                            results_dir=tmp_path)
    [path] = tmp_path.glob("bench-*.json")
    return status, json.loads(path.read_text())


def test_a_failing_section_does_not_lose_the_others_json(redis_server, tmp_path, capsys):
    sections = {"decision": section(1, "first"), "memory": failing_memory,
                "scale": section(5, "last")}
    status, report = run_bench(["--quick"], sections, redis_server, tmp_path)
    out = capsys.readouterr().out

    assert status == 1
    assert report["failed"] == ["memory"]
    memory = report["sections"]["memory"]
    assert memory["status"] == "failed"
    assert memory["error"].startswith("error: unpack_from requires a buffer")  # struct.error
    assert "unpack_value" in memory["traceback"]
    for name, key in (("decision", "first"), ("scale", "last")):
        assert report["sections"][name]["status"] == "ok"
        # each section ran, after the failure too, on a Redis emptied for it
        assert report["sections"][name]["results"] == {"keys": 1}
        assert report["sections"][name]["targets"] == [[f"{1 if key == 'first' else 5}. "
                                                        f"{key} target", "1×", "met"]]
    assert "## memory: FAILED\n\nerror: unpack_from requires a buffer" in out
    assert "| 1. first target | 1× | met |" in out and "| 5. last target | 1× | met |" in out
    assert "| memory | error: unpack_from requires a buffer" in out


def test_a_run_without_failures_exits_zero(redis_server, tmp_path):
    sections = {"decision": section(1, "first"), "memory": failing_memory}
    status, report = run_bench(["--only", "decision"], sections, redis_server, tmp_path)
    assert status == 0
    assert report["failed"] == [] and list(report["sections"]) == ["decision"]


def bucket_key(name):
    return f"rl:{{ip.{name}}}"


def test_the_memory_reader_skips_a_key_gone_between_listing_and_reading(redis_client):
    records = {7: (5_000, 1_700_000_000_000, 60_000), 9: (10, 1_700_000_000_000, 1_000)}
    for name in ("a", "b", "c", "d", "e"):
        redis_client.set(bucket_key(name), pack_value(records), px=60_000)
    redis_client.set("rl:version", b"3")  # not an identity's key: not listed
    listed = []

    def between(keys):
        listed.extend(keys)
        assert redis_client.delete(bucket_key("b"), bucket_key("e")) == 2  # gone for real
        redis_client.set(bucket_key("c"), pack_value({7: records[7]}), px=120_000)  # changed

    states, vanished = read_keys(redis_client, "rl:{ip.*", after_listing=between, batch=2)

    assert len(listed) == 5 and vanished == 2
    assert sorted(states) == [bucket_key(name).encode() for name in ("a", "c", "d")]
    assert states[bucket_key("a").encode()].buckets == records
    changed = states[bucket_key("c").encode()]
    assert changed.buckets == {7: records[7]} and 60_000 < changed.pttl_ms <= 120_000
    assert all(state.memory_usage > 0 for state in states.values())


def test_the_asgi_async_views_target_is_ours_over_the_take_alone(capsys):
    # rounds of req/s: ours 0.96× the call alone, 0.90× no throttle
    rps = {"none-asgi-async": 1000.0, "take-asgi-async": 937.5, "ours-asgi-async": 900.0}
    samples = {label: [rps.get(label, 800.0)] * 3 for label in LABELS}
    cpu = {label: [100.0 if label.startswith("none") else 110.0] * 3 for label in LABELS}
    redis_cpu = {label: [10.0] * 3 for label in LABELS}
    ratios = {}

    def paired(name, baseline):
        return samples[name][0] / samples[baseline][0]

    lines, targets = asgi_ratios(samples, cpu, redis_cpu, 10.0, paired, ratios,
                                 (float("nan"), float("nan")))

    assert ratios["asgi.vs_take_alone"] == pytest.approx(0.96)
    assert ratios["asgi.vs_none"] == pytest.approx(0.90)  # still recorded, no longer a target
    [row] = [row for row in targets if "take.lua call alone" in row[0]]
    assert row == ("3. ASGI (async def view): ours ≥ 0.95× ours' take.lua call alone (req/s; "
                   "the floor every exact limiter pays)", "0.96×", "met")
    assert not any("no throttle (req/s)" in row[0] for row in targets)
    assert len(targets) == len(ASGI_VIEWS) + 1


def test_ours_and_the_take_alone_run_side_by_side_in_both_orders():
    seen = set()
    for round_number in range(12):
        order = round_order(ROUND_GROUPS, round_number)
        ours, take = order.index("ours-asgi-async"), order.index("take-asgi-async")
        assert abs(ours - take) == 1, round_number
        seen.add(take > ours)
    assert seen == {True, False}
