"""make bench's sections: one that raises is reported as failed while the others still run and
their JSON is written; the memory section reads a key that vanished or changed between listing
and reading without failing."""

import json

from bench import run as bench_run
from bench.memory import read_keys
from ratelimit_app.buckets import pack_value, unpack_value


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
