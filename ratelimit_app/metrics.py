"""In-process decision counters (the dashboard's flush pipeline builds on these).

``record_decision`` runs on every request, so it only touches process memory.
"""

import threading
from collections import Counter

__all__ = ["record_decision", "snapshot_counts"]

_lock = threading.Lock()
_counts = Counter()


def record_decision(decision):
    """Count one decision: allowed/denied overall and per violated or shadow policy."""
    outcome = "allowed" if decision.allowed else "denied"
    with _lock:
        _counts[outcome] += 1
        for name in decision.violated:
            _counts["denied:" + name] += 1
        for name in decision.shadow_violations:
            _counts["shadow:" + name] += 1
        if decision.degraded:
            _counts["degraded:" + decision.degraded] += 1


def snapshot_counts():
    """Return a copy of this process's counters."""
    with _lock:
        return dict(_counts)
