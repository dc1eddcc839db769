"""``manage.py ratelimit check``: can this deployment decide requests right now?

Each check gives one or more lines OK, WARN or FAIL: the app's Django system checks, the store
answering, the limiter's script running there, one real decision on a scratch identity (through
the same store path a request takes; its key deleted again, see round_trip.py), the config
version, and the clock skew between this machine and Redis (every primary of a cluster). A
failing decision says whether Redis was unavailable or the call failed with an unexpected
error (a bug or a library incompatibility). When the store does not answer, the checks
that need it say so instead of each waiting for its own timeout.
"""

import dataclasses
import time

from django.apps import apps
from django.core import checks
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from ..decision.forwarding import read_sighting
from ..decision.identity import is_trusted_proxy
from ..runtime.limiter import default_limiter
from ..stores import StoreUnavailable
from . import round_trip
from .round_trip import describe_error

__all__ = ["OK", "WARN", "FAIL", "CheckLine", "run_operator_checks"]

OK, WARN, FAIL = "OK", "WARN", "FAIL"
# Buckets refill on Redis's clock; this machine's clock stamps the metrics minutes and the
# config version. A second apart shifts dashboard minutes; a minute apart misfiles them.
SKEW_WARN_S = 1.0
SKEW_FAIL_S = 60.0


@dataclasses.dataclass(frozen=True)
class CheckLine:
    level: str
    name: str
    message: str

    def __str__(self):
        return f"{self.level:<4}  {self.name}: {self.message}"


def _system_checks():
    app = apps.get_app_config("ratelimit_app")
    found = [m for m in checks.run_checks(app_configs=[app]) if not m.is_silenced()]
    if not found:
        return [CheckLine(OK, "system checks", "no issues")]
    lines = []
    for message in found:
        level = FAIL if message.level >= checks.ERROR else \
            WARN if message.level >= checks.WARNING else OK
        hint = f" (hint: {message.hint})" if message.hint else ""
        lines.append(CheckLine(level, f"system check {message.id}", f"{message.msg}{hint}"))
    return lines


def _primaries(client):
    """Yield ``(name, redis client)`` for each primary holding buckets."""
    if isinstance(client, RedisCluster):
        for node in client.get_primaries():
            yield f"Redis node {node.name}", client.get_redis_connection(node)
    else:
        yield "Redis", client


def _clock_skew(store):
    lines = []
    try:
        for name, client in _primaries(store.metrics_client()):
            before = time.time()
            seconds, microseconds = client.time()
            after = time.time()
            # Redis read its clock somewhere between our two readings
            skew_s = seconds + microseconds / 1e6 - (before + after) / 2
            level = FAIL if abs(skew_s) > SKEW_FAIL_S else WARN if abs(skew_s) > SKEW_WARN_S \
                else OK
            direction = "ahead of" if skew_s >= 0 else "behind"
            lines.append(CheckLine(level, "clock skew",
                                   f"{name} is {abs(skew_s):.3f} s {direction} this machine "
                                   f"(±{(after - before) / 2:.3f} s)"))
    except (RedisError, StoreUnavailable) as exc:
        lines.append(CheckLine(FAIL, "clock skew", f"cannot read Redis TIME: {exc}"))
    return lines


def run_operator_checks():
    """Return the CheckLines of every check, in the order they ran."""
    lines = _system_checks()
    limiter = default_limiter()
    store = limiter.store
    try:
        store.ping()
        problems = store.problems()
    except StoreUnavailable as exc:
        lines.append(CheckLine(FAIL, "store", f"the {store.kind} store does not answer: {exc}"))
        return lines + _not_checked("the store does not answer")
    except Exception as exc:  # redis-py itself fails: so will every decision
        lines.append(CheckLine(FAIL, "store", f"unexpected error (a bug or a library "
                                              f"incompatibility): {describe_error(exc)}"))
        return lines + _not_checked("the store's client fails")
    lines.append(CheckLine(OK, "store", f"the {store.kind} store answers PING"))
    lines += [CheckLine(FAIL, "script", problem) for problem in problems] or \
        [CheckLine(OK, "script", "the limiter's script runs")]
    lines.append(_decision_line(round_trip.decision_round_trip(limiter)))
    try:
        version = limiter.read_version()
        lines.append(CheckLine(OK, "config version", version if version != "0" else
                               "0 (no quota change announced since Redis was emptied)"))
    except StoreUnavailable as exc:
        lines.append(CheckLine(FAIL, "config version", f"cannot be read: {exc}"))
    return lines + _clock_skew(store) + [_forwarding_line(store, limiter.config["KEY_PREFIX"])]


def _forwarding_line(store, prefix):
    """WARN when a worker saw X-Forwarded-For from an address outside TRUSTED_PROXIES in the
    last day (decision/forwarding.py), unless that address is trusted by now."""
    name = "forwarded requests"
    try:
        sighting = read_sighting(store.metrics_client(), prefix)
    except (RedisError, StoreUnavailable) as exc:
        return CheckLine(FAIL, name, f"cannot be read: {exc}")
    if sighting is None:
        return CheckLine(OK, name, "no X-Forwarded-For from an address outside TRUSTED_PROXIES "
                                   "seen in the last 24 h")
    address = sighting["address"]
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(sighting["at"]))
    if is_trusted_proxy(address):
        return CheckLine(OK, name, f"{address}, which sent X-Forwarded-For at {at}, is in "
                                   f"TRUSTED_PROXIES now")
    return CheckLine(WARN, name, f"a request from {address} carried X-Forwarded-For at {at} "
                                 f"(process {sighting['pid']}), but {address} is not in "
                                 f"TRUSTED_PROXIES: the header is ignored. If it is your proxy, "
                                 f"every client behind it shares its address; add it to "
                                 f"TRUSTED_PROXIES")


def _not_checked(reason):
    return [CheckLine(FAIL, name, f"not checked: {reason}")
            for name in ("script", "decision", "config version", "clock skew")]


def _decision_line(trip):
    """Return the CheckLine of a scratch decision's RoundTrip."""
    if trip.outcome == round_trip.OK:
        return CheckLine(OK, "decision", f"{trip.detail} ({trip.elapsed_ms:.1f} ms)")
    reason = {round_trip.UNAVAILABLE: "Redis unavailable",
              round_trip.MISCONFIGURED: "Redis refuses it",
              round_trip.UNEXPECTED: "unexpected error (a bug or a library incompatibility; "
                                     "every request is let through unlimited)"}[trip.outcome]
    return CheckLine(FAIL, "decision", f"{reason}: {trip.detail}")
