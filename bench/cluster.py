"""8. Scale-out: one Redis node vs a 3-master Redis Cluster (with replicas), the same Limiter code.

Three workloads, each decision by the next of 300 signed-in users:
- spread: a user bucket only (one slot group per decision, the users' slots all over the masters);
- hot: the same plus a global bucket every decision touches (two groups, one master always);
- hot + leases: that global rule leases 100 tokens at a time to the worker.

Decisions per second are in-process and sequential (one caller), interleaved rounds. Redis CPU
per decision is INFO commandstats (EVALSHA usec) summed over every node, divided by decisions;
"hot master" is the share of EVALSHA calls served by the global bucket's master. The calls that
reach the hot bucket itself are the script calls per decision beyond the spread workload's one
(its user bucket): one per decision without leases, one per lease with them.
"""

import itertools

from ratelimit_app.conf import get_config
from ratelimit_app.runtime.limiter import Limiter
from ratelimit_app.stores import RedisStore
from ratelimit_app.testing import RedisCluster

from . import alternatives
from .harness import interleave, median, paired_ratio, table, timings, verdict

WORKLOADS = {"spread": "c-spread", "hot": "c-hot", "hot + leases": "c-lease"}
LEASE_CALL_SHARE_TARGET = 0.2  # leases: at most this share of the hot bucket's calls remain


def _decider(limiter, users):
    """One decision per call, each by the next user (a new request object each time)."""
    requests = itertools.cycle([(alternatives.django_request(user=u), u) for u in users])

    def decide():
        request, user = next(requests)
        limiter.decide(request, user, "bench:item")
    return decide


def _cpu_per_decision(decide, stats, count):
    """Return (EVALSHA usec, EVALSHA calls) per decision over ``count`` decisions."""
    calls_before, usec_before = stats()
    for _ in range(count):
        decide()
    calls, usec = stats()
    return (usec - usec_before) / count, (calls - calls_before) / count


def run(env, quick):
    from ratelimit_app.stores.cluster import ClusterStore

    cluster = RedisCluster().start()
    try:
        config = get_config()
        single = Limiter(config, RedisStore(env.redis.client()), metrics_autostart=False)
        nodes = cluster.nodes_env.split(",")
        on_cluster = Limiter({**config, "CLUSTER_NODES": nodes},
                             ClusterStore.from_nodes(nodes, config["CLUSTER_OPTIONS"]),
                             metrics_autostart=False)
        deciders, stats = {}, {}
        for workload, plan in WORKLOADS.items():
            users = env.users["cluster"][plan]
            deciders[f"one node, {workload}"] = _decider(single, users)
            deciders[f"cluster, {workload}"] = _decider(on_cluster, users)
            stats[f"one node, {workload}"] = lambda: env.redis.command_stats("evalsha")
            stats[f"cluster, {workload}"] = lambda: cluster.command_stats("evalsha")
        rounds, batch = (3, 300) if quick else (9, 1000)
        samples = interleave(deciders, rounds, batch, warmup=300)
        hot_master = cluster.master_of("{global}")
        cpu, hot_share = {}, {}
        for name, decide in deciders.items():
            before = hot_master.command_calls("evalsha")
            cpu[name] = _cpu_per_decision(decide, stats[name], batch)
            if name.startswith("cluster"):
                hot_share[name] = (hot_master.command_calls("evalsha") - before) / \
                    (cpu[name][1] * batch)
    finally:
        cluster.stop()

    rows, ratios = [], {}
    for workload in WORKLOADS:
        one, many = f"one node, {workload}", f"cluster, {workload}"
        speed = paired_ratio(samples, one, many)  # µs ratio = decisions/s ratio, inverted
        cpu_ratio = cpu[many][0] / cpu[one][0] if cpu[one][0] else float("nan")
        ratios[f"cluster.{workload}.decisions_per_s_vs_one_node"] = speed
        ratios[f"cluster.{workload}.redis_cpu_vs_one_node"] = cpu_ratio
        for name in (one, many):
            rows.append([name, 1e6 / median(samples[name]), median(samples[name]),
                         cpu[name][0], cpu[name][1],
                         f"{hot_share[name]:.0%}" if name in hot_share else "—"])
    def hot_bucket_calls(workload):  # script calls per decision that reach the global bucket
        return cpu[f"cluster, {workload}"][1] - cpu["cluster, spread"][1]

    lease_share = hot_bucket_calls("hot + leases") / hot_bucket_calls("hot")
    ratios["cluster.leases.hot_bucket_calls_vs_no_leases"] = lease_share
    markdown = table(["variant", "decisions/s", "µs", "Redis µs / decision (all nodes)",
                      "EVALSHA / decision", "calls on the hot master"], rows)
    markdown += "\n\n" + table(["ratio (same run)", "value"], [[k, f"{v:.2f}×"]
                                                             for k, v in ratios.items()])
    # issue 6's slot groups: a decision is one script call per slot its buckets span
    groups = {w: cpu[f"cluster, {w}"][1] for w in ("spread", "hot")}
    ratios.update({f"cluster.{w}.evalsha_per_decision": g for w, g in groups.items()})
    targets = [("5. cluster groups unchanged: EVALSHA per decision spread 1, hot 2",
                f"{groups['spread']:.2f}, {groups['hot']:.2f}",
                verdict(groups == {"spread": 1.0, "hot": 2.0})),
               (f"8. leases: the hot bucket sees ≤ {LEASE_CALL_SHARE_TARGET:.0%} of the calls it "
                f"sees without leases", f"{lease_share:.2f}×",
                verdict(lease_share <= LEASE_CALL_SHARE_TARGET))]
    return {"title": "8. Scale-out: one node vs a 3-master Redis Cluster",
            "markdown": markdown, "ratios": ratios, "targets": targets,
            "results": {name: {**timing, "redis_usec_per_decision": cpu[name][0],
                               "evalsha_per_decision": cpu[name][1]}
                        for name, timing in timings(samples).items()}}
