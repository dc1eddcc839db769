"""7. Scale: decision cost (whole path, in-process) with 10 vs 1,000 configured rules that do not
apply to the request, and with hierarchy depth 1 to 6, variants interleaved."""

import time
from dataclasses import replace

from ratelimit_app.runtime.limiter import default_limiter

from . import alternatives
from .harness import interleave, median, paired_ratio, table, timings, verdict


def _with_snapshot(snapshot, decide):
    """Run ``decide`` with ``snapshot`` installed as the process's current policy."""
    policies = default_limiter().policies

    def run():
        policies.snapshot, policies.stale = snapshot, False
        policies.checked_at = time.monotonic()
        decide()
    return run


def run(env, quick):
    full = default_limiter().snapshot()
    noise = [r for r in full.rules if r.name.startswith("noise-")]
    kept = [r for r in full.rules if not r.name.startswith("noise-")]
    few = replace(full, rules=tuple(kept + noise[:10]), _rules_for={})
    many = replace(full, rules=tuple(kept + noise), _rules_for={})
    decide = alternatives.ours(env.users[4])
    variants = {"10 rules that do not apply": _with_snapshot(few, decide),
                "1,000 rules that do not apply": _with_snapshot(many, decide)}
    for depth in range(1, 7):
        variants[f"depth {depth}"] = _with_snapshot(many, alternatives.ours(env.users[depth]))
    rounds, batch = (5, 200) if quick else (11, 400)
    samples = interleave(variants, rounds, batch)
    default_limiter().policies.reset()
    flat = paired_ratio(samples, "1,000 rules that do not apply", "10 rules that do not apply")
    rows = [[name, median(values), f"{paired_ratio(samples, name, 'depth 1'):.2f}×"]
            for name, values in samples.items()]
    targets = [("5. cost flat with 1,000 vs 10 rules that do not apply (≤ 1.10×)", f"{flat:.2f}×",
                verdict(flat <= 1.10))]
    return {"title": "7. Scale (whole path, in-process)",
            "markdown": table(["configuration", "median µs", "÷ depth 1"], rows),
            "results": timings(samples),
            "targets": targets, "ratios": {"scale.rules_1000_vs_10": flat}}
