"""Fan-out of one decision over a Redis Cluster: how to send one small script call to each of
3 masters (issue 10 §2: redis-py's cluster pipeline refuses EVALSHA; measure and choose).

    .venv/bin/python bench/cluster_fanout.py [--quick]

Starts its own 3-master/3-replica cluster (ratelimit_app.testing.RedisCluster, 127.0.0.1, free
ports) and stops it by PID at the end. One "decision" = INCRBY of one key on each master, through
a one-line script. Variants run interleaved (A B C …, order rotated every round); the table shows
medians over rounds and the paired ratio to the sequential baseline. Not part of `make bench` yet.
"""

import argparse
import asyncio
import gc
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Import bench.* and ratelimit_app from the repository root (not bench/ as the top level).
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import redis.asyncio.cluster  # noqa: E402

from bench.harness import median, paired_ratio, spread, table  # noqa: E402
from ratelimit_app.testing import RedisCluster  # noqa: E402

SCRIPT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
LIBRARY = """#!lua name=fanout
redis.register_function('fanout_incr', function(keys, args)
  return redis.call('INCRBY', keys[1], args[1])
end)"""
BASELINE = "a. sequential EVALSHA (RedisCluster.evalsha)"
CONCURRENT_CALLERS = 8


def one_tag_per_master(cluster):
    """A hash-tagged key on each master, in slot order."""
    keys = []
    for master in cluster.masters():
        keys.append(next(key for key in (f"{{fanout:{n}}}:bucket" for n in range(10_000))
                         if cluster.master_of(key) is master))
    return keys


class Variants:
    """Every way of making one decision (3 script calls, one per master), as plain callables
    (sync) or coroutine functions (async). Owns the clients, the thread pool and the loop."""

    def __init__(self, cluster, keys):
        self.keys = keys
        self.client = cluster.client()
        self.sha = self.client.script_load(SCRIPT)  # redis-py loads it on every primary
        for master in cluster.masters():
            with master.client() as node:
                node.function_load(LIBRARY, replace=True)
        # the per-node redis.Redis clients a ClusterStore would get after grouping by slot
        self.node_clients = [self.client.get_node_from_key(key).redis_connection for key in keys]
        self.pool = ThreadPoolExecutor(max_workers=len(keys), thread_name_prefix="fanout")
        self.loop = asyncio.new_event_loop()
        self.async_client = self.loop.run_until_complete(self._async_client(cluster))

    @staticmethod
    async def _async_client(cluster):
        client = redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode("127.0.0.1", node.port)
                           for node in cluster.nodes], socket_timeout=2)
        await client.initialize()
        return client

    def close(self):
        self.pool.shutdown()
        self.loop.run_until_complete(self.async_client.aclose())
        self.loop.close()
        self.client.close()

    # -- the variants: each returns the three new counter values ------------------------------

    def sequential_cluster_client(self):
        return [self.client.evalsha(self.sha, 1, key, 1) for key in self.keys]

    def sequential_node_clients(self):
        return [node.evalsha(self.sha, 1, key, 1) for node, key in zip(self.node_clients, self.keys)]

    def thread_pool(self):
        futures = [self.pool.submit(self.client.evalsha, self.sha, 1, key, 1) for key in self.keys]
        return [future.result() for future in futures]

    async def asyncio_gather(self):
        return await asyncio.gather(*(self.async_client.evalsha(self.sha, 1, key, 1)
                                      for key in self.keys))

    def asyncio_from_sync(self):
        # what a sync Django worker pays to use the asyncio client: one loop run per decision
        return self.loop.run_until_complete(self.asyncio_gather())

    def hand_pipelined(self):
        """Write the three EVALSHAs on three sockets, then read the three replies."""
        taken = [(node, node.connection_pool.get_connection()) for node in self.node_clients]
        try:
            for (node, connection), key in zip(taken, self.keys):
                connection.send_command("EVALSHA", self.sha, 1, key, 1)
            return [node.parse_response(connection, "EVALSHA") for node, connection in taken]
        except BaseException:
            for _, connection in taken:  # replies may be left unread on the socket
                connection.disconnect()
            raise
        finally:
            for node, connection in taken:
                node.connection_pool.release(connection)

    def cluster_pipeline_fcall(self):
        # the cluster pipeline writes to every node first, then reads (no EVALSHA, FCALL is allowed)
        pipe = self.client.pipeline(transaction=False)
        for key in self.keys:
            pipe.fcall("fanout_incr", 1, key, 1)
        return pipe.execute()

    def catalogue(self):
        """name -> (kind, callable); kind "sync" or "async" (timed inside the running loop)."""
        return {
            BASELINE: ("sync", self.sequential_cluster_client),
            "a'. sequential EVALSHA, per-node Redis clients": ("sync", self.sequential_node_clients),
            "b. thread pool (3 threads), RedisCluster.evalsha": ("sync", self.thread_pool),
            "c. asyncio RedisCluster + gather, from sync code": ("sync", self.asyncio_from_sync),
            "c'. asyncio RedisCluster + gather, inside the loop": ("async", self.asyncio_gather),
            "d. hand-pipelined EVALSHA on 3 node connections": ("sync", self.hand_pipelined),
            "e. cluster pipeline of 3 FCALLs": ("sync", self.cluster_pipeline_fcall),
        }

    # -- timing -----------------------------------------------------------------------------

    def run_batch(self, kind, fn, batch):
        """Seconds for ``batch`` decisions made one after the other."""
        if kind == "sync":
            started = time.perf_counter()
            for _ in range(batch):
                fn()
            return time.perf_counter() - started

        async def batch_in_loop():
            started = time.perf_counter()
            for _ in range(batch):
                await fn()
            return time.perf_counter() - started

        return self.loop.run_until_complete(batch_in_loop())

    def run_concurrent(self, kind, fn, seconds):
        """Decisions/s with CONCURRENT_CALLERS callers in this process (threads, or tasks)."""
        if kind == "async":
            async def caller(deadline):
                count = 0
                while time.perf_counter() < deadline:
                    await fn()
                    count += 1
                return count

            async def all_callers():
                deadline = time.perf_counter() + seconds
                return sum(await asyncio.gather(*(caller(deadline)
                                                  for _ in range(CONCURRENT_CALLERS))))

            return self.loop.run_until_complete(all_callers()) / seconds
        if fn == self.asyncio_from_sync:
            return None  # one event loop cannot be run from several threads at once
        counts = [0] * CONCURRENT_CALLERS
        deadline = time.perf_counter() + seconds

        def caller(index):
            while time.perf_counter() < deadline:
                fn()
                counts[index] += 1

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(CONCURRENT_CALLERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(counts) / seconds


def interleaved(variants, catalogue, rounds, batch, warmup):
    """name -> µs per decision, one value per round; variants take turns, order rotated."""
    names = list(catalogue)
    for name in names:
        variants.run_batch(*catalogue[name], warmup)
    samples = {name: [] for name in names}
    for round_number in range(rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            samples[name].append(variants.run_batch(*catalogue[name], batch) / batch * 1e6)
    return samples


def check_calls(cluster, variants, catalogue):
    """Every variant really makes one script call on each master, and counts right."""
    for name, (kind, fn) in catalogue.items():
        before = [variants.client.get(key) for key in variants.keys]
        calls_before = sum(cluster.command_calls(c, masters_only=True) for c in ("evalsha", "fcall"))
        values = (variants.loop.run_until_complete(fn()) if kind == "async" else fn())
        calls = sum(cluster.command_calls(c, masters_only=True) for c in ("evalsha", "fcall"))
        expected = [int(value or 0) + 1 for value in before]
        assert [int(value) for value in values] == expected, (name, values, expected)
        assert calls - calls_before == len(variants.keys), (name, calls - calls_before)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    options = parser.parse_args()
    rounds, batch, warmup, concurrent_s = (5, 100, 50, 0.5) if options.quick else (21, 300, 300, 2.0)

    with RedisCluster() as cluster:
        keys = one_tag_per_master(cluster)
        variants = Variants(cluster, keys)
        try:
            catalogue = variants.catalogue()
            check_calls(cluster, variants, catalogue)
            samples = interleaved(variants, catalogue, rounds, batch, warmup)
            throughput = {name: [] for name in catalogue}
            for round_number in range(3):  # interleaved too, fewer and longer rounds
                shift = round_number % len(catalogue)
                names = list(catalogue)
                for name in names[shift:] + names[:shift]:
                    throughput[name].append(variants.run_concurrent(*catalogue[name], concurrent_s))
        finally:
            variants.close()

    rows = []
    for name, values in samples.items():
        rows.append([name, median(values), f"{spread(values):.0%}",
                     f"{paired_ratio(samples, name, BASELINE):.2f}×",
                     1e6 / median(values),
                     "n/a" if None in throughput[name] else median(throughput[name])])
    print(f"\nOne decision = 1 script call on each of 3 masters; {rounds} interleaved rounds of "
          f"{batch} decisions; throughput with {CONCURRENT_CALLERS} callers (threads; tasks for "
          f"c') in one process, median of 3 runs of {concurrent_s} s.\n")
    print(table(["variant", "µs/decision (median)", "spread (IQR)", "vs sequential",
                 "decisions/s, 1 caller", f"decisions/s, {CONCURRENT_CALLERS} callers"], rows))


if __name__ == "__main__":
    main()
