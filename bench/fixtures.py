"""The benchmark's quota configuration, written to its own SQLite database.

- plans ``d1``..``d6``: a hierarchy of depth 1..6 for a signed-in user with a tenant
  (global, plan, tenant, user, ip, endpoint), generous so every request is allowed;
- plan ``anon`` (the anonymous default): global, plan, ip and an ip rule on ``bench:item`` (and
  one on ``bench:aitem``, the async view) for the HTTP runs (4 levels), an ip rule on
  ``bench:flood`` that the flood exceeds, and an ip rule on ``bench:memory`` that keeps one key
  per identity for an hour (and one on ``bench:expiry`` for 2 s);
- plan ``og``: the over-grant rule, burst 10, 10 per second;
- 1,000 "noise" rules that never apply to the measured requests (other plans, other endpoints);
- plans ``c-spread`` (a user rule only), ``c-hot`` (a global rule of its own and a user rule) and
  ``c-lease`` (the same with a lease on the global rule), each with CLUSTER_USERS users, for the
  cluster section.
"""

from django.contrib.auth import get_user_model

from ratelimit_app.business.credits.ledger import top_up
from ratelimit_app.business.credits.models import MAX_TOP_UP_UNITS
from ratelimit_app.models import MAX_PERIOD_S, Kind, Mode, Plan, PlanAssignment, Rule, Scope

HUGE = 1_000_000
DEPTH_SCOPES = [  # (scope, endpoint) of each level, widest first
    (Scope.GLOBAL, ""), (Scope.PLAN, ""), (Scope.TENANT, ""), (Scope.USER, ""), (Scope.IP, ""),
    (Scope.USER, "bench:item"),
]
NOISE_RULES = 1000
CLUSTER_USERS = 300
CLUSTER_LEASE = 100
OVERGRANT = {"rate": 10, "period_s": 1, "burst": 10}
FLOOD = {"rate": 10, "period_s": 1, "burst": 10}


def _rule(name, plan, scope, endpoint="", rate=HUGE, period_s=1, burst=HUGE, lease=0):
    return Rule(name=name, plan=plan, scope=scope, endpoint=endpoint, rate=rate,
                period_s=period_s, burst=burst, mode=Mode.ENFORCE, enabled=True, lease=lease)


def load():
    """Create plans, rules and users; return {depth: user} for the depth plans."""
    User = get_user_model()
    rules, users = [], {}
    for depth in range(1, 7):
        plan = Plan.objects.create(slug=f"d{depth}", name=f"Depth {depth}")
        for level, (scope, endpoint) in enumerate(DEPTH_SCOPES[:depth]):
            rules.append(_rule(f"d{depth}-{level}-{scope}", plan, scope, endpoint))
        user = User.objects.create(username=f"user{depth}")
        PlanAssignment.objects.create(user=user, plan=plan, tenant="acme")
        users[depth] = user

    anon = Plan.objects.create(slug="anon", name="Anonymous", default_for_anonymous=True)
    rules += [
        _rule("anon-global", anon, Scope.GLOBAL), _rule("anon-plan", anon, Scope.PLAN),
        _rule("anon-ip", anon, Scope.IP), _rule("anon-item-ip", anon, Scope.IP, "bench:item"),
        _rule("anon-aitem-ip", anon, Scope.IP, "bench:aitem"),
        _rule("anon-flood-ip", anon, Scope.IP, "bench:flood", **FLOOD),
        # an hour's TTL, far beyond the minute or so the memory section takes to fill and read
        # its keys: at 60 s, a slow host's first keys expired before they were read
        _rule("anon-memory-ip", anon, Scope.IP, "bench:memory", rate=1, period_s=3600, burst=10),
        _rule("anon-expiry-ip", anon, Scope.IP, "bench:expiry", rate=1, period_s=2, burst=10),
    ]

    og = Plan.objects.create(slug="og", name="Over-grant")
    rules.append(_rule("og-user", og, Scope.USER, **OVERGRANT))
    users["og"] = User.objects.create(username="overgrant")
    PlanAssignment.objects.create(user=users["og"], plan=og)

    users["cluster"] = {}
    for slug, lease in (("c-spread", None), ("c-hot", 0), ("c-lease", CLUSTER_LEASE)):
        plan = Plan.objects.create(slug=slug, name=slug)
        if lease is not None:  # a global bucket of this plan's own, hot in every decision
            rules.append(_rule(f"{slug}-global", plan, Scope.GLOBAL, lease=lease))
        rules.append(_rule(f"{slug}-user", plan, Scope.USER))
        members = User.objects.bulk_create(
            [User(username=f"{slug}-{i}") for i in range(CLUSTER_USERS)])
        PlanAssignment.objects.bulk_create(
            [PlanAssignment(user=member, plan=plan) for member in members])
        users["cluster"][slug] = members

    # the 4 levels of d4 and a prepaid credit balance (issue 34: a decision with a balance)
    credits = Plan.objects.create(slug="d4-credits", name="Depth 4 with credits")
    for level, (scope, endpoint) in enumerate(DEPTH_SCOPES[:4]):
        rules.append(_rule(f"d4c-{level}-{scope}", credits, scope, endpoint))
    rules.append(Rule(name="d4c-credits", plan=credits, scope=Scope.USER, kind=Kind.CREDITS,
                      rate=0, burst=0, period_s=MAX_PERIOD_S, mode=Mode.ENFORCE))
    users["credits"] = User.objects.create(username="user4-credits")
    PlanAssignment.objects.create(user=users["credits"], plan=credits, tenant="acme")
    # units for any run (the first decision seeds the balance from this top-up)
    top_up(f"user:{users['credits'].pk}", MAX_TOP_UP_UNITS, "bench-credits", actor="bench")

    other = Plan.objects.create(slug="other", name="Other")
    for i in range(NOISE_RULES):
        # half for another plan, half for every plan but another endpoint
        if i % 2:
            rules.append(_rule(f"noise-{i}", other, Scope.USER))
        else:
            rules.append(_rule(f"noise-{i}", None, Scope.USER, f"bench:other-{i}"))
    Rule.objects.bulk_create(rules)
    return users
