"""Ban rules present: the cost of checking the penalty box with every decision.

A 4-level decision (bench/fixtures.py's d4 plan: global, plan, tenant, user) is sent as the
store sends it (ban checks folded: stores/ban_checks.py), with no ban rule, with one of the
user's (its ban record in the user's key, which the decision reads anyway), and with two (the
user's and the client IP's: the IP's key is one the decision did not read before) and allow and
deny lists present (entries that do not match the caller: compiled into the snapshot, they cost
no Redis call). The target is judged on the last. Redis CPU is
EVALSHA's ``usec_per_call`` under load (pipelined, as redis_cpu.py);
round trips are EVALSHA calls per decision through the whole path, one at a time.
"""

from ratelimit_app.models import AccessListEntry, BanRule
from ratelimit_app.runtime.limiter import default_limiter

from . import alternatives
from .harness import median, table, verdict
from .redis_cpu import _one_at_a_time, _our_call, _under_load

TARGET = 1.05  # with ban rules ÷ without, Redis CPU per decision under load
DEPTH = 4


def _ban_rules(scopes):
    return [BanRule.objects.create(name=f"bench-ban-{scope}", scope=scope, events="statuses",
                                   statuses="404", threshold=50, window_s=60, ban_s=600)
            for scope in scopes]


def _list_entries():
    """Deny and allow entries of every kind the caller (10.1.2.3, the d4 user) matches none of."""
    return [AccessListEntry.objects.create(kind="deny", target="ip", value=value,
                                           reason="bench")
            for value in ("203.0.113.0/24", "2001:db8::/32")] + [
        AccessListEntry.objects.create(kind="deny", target="user_agent", value="bench-scraper",
                                       reason="bench"),
        AccessListEntry.objects.create(kind="allow", target="ip", value="192.0.2.0/24",
                                       reason="bench")]


def _variant(env, lists=False):
    """``(pipelined call, one-at-a-time decision)`` of the d4 user, on the rules in force."""
    default_limiter().policies.reset()
    if lists and default_limiter().snapshot().access_lists is None:
        raise RuntimeError("the list entries are not in the snapshot")
    return _our_call(env.users[DEPTH]), alternatives.ours(env.users[DEPTH])


def run(env, quick):
    client = env.client()
    calls = {"without": _variant(env)}
    for name, scopes in (("user", ("user",)), ("with", ("user", "ip"))):
        rules = _ban_rules(scopes) + (_list_entries() if name == "with" else [])
        try:
            calls[name] = _variant(env, lists=name == "with")
        finally:
            for rule in rules:
                rule.delete()
            default_limiter().policies.reset()
    rounds, count = (3, 500) if quick else (7, 2000)
    usec = {name: [] for name in calls}
    trips = {}
    inner = {}
    for _ in range(rounds):  # interleaved
        for name, (loaded, sequential) in calls.items():
            sequential()  # loads the script
            used, redis_calls, _ = _under_load(client, *loaded, count * 2)
            usec[name].append(used)
            inner[name] = redis_calls
            _, _, per_decision = _one_at_a_time(client, sequential, count)
            trips[name] = max(trips.get(name, 0), per_decision)
    ratio = median([w / wo for w, wo in zip(usec["with"], usec["without"])])
    user_ratio = median([w / wo for w, wo in zip(usec["user"], usec["without"])])
    labels = {"without": "none", "user": "the user's (its key read anyway)",
              "with": "the user's and the client IP's, and lists"}
    rows = [[labels[name], median(usec[name]), f"{inner[name]:.0f}", f"{trips[name]:.2f}"]
            for name in ("without", "user", "with")]
    markdown = table(["ban rules", "µs per decision under load", "redis.calls",
                      "EVALSHA per decision"], rows)
    return {
        "title": "Ban rules present: Redis CPU and round trips per 4-level decision",
        "markdown": markdown,
        "results": {name: {"us": median(usec[name]), "samples": usec[name],
                           "redis_calls": inner[name], "evalsha_per_decision": trips[name]}
                    for name in calls},
        "ratios": {"bans.cpu_with_vs_without": ratio, "bans.cpu_user_ban_vs_without": user_ratio,
                   "bans.evalsha_per_decision": trips["with"]},
        "targets": [
            (f"9. a decision with ban rules and lists present costs ≤ {TARGET}× the Redis CPU "
             f"of one without", f"{ratio:.3f}×", verdict(ratio <= TARGET)),
            ("9. one round trip (EVALSHA) per decision with ban rules and lists present",
             f"{trips['with']:.2f}", verdict(trips["with"] == 1)),
        ],
    }
