"""One real decision against the configured store, for ``manage.py check`` and
``manage.py ratelimit check``: can this process decide a request right now?

PING and a bucket-less script call prove that Redis answers; they do not prove that the
decision path works. That path has its own code (``stores/connections.py`` takes connections
from redis-py's pool itself; ``stores/cluster.py`` pipelines by hand), and a library
incompatibility there fails every decision while PING is fine: redis-py 5.0's
``ConnectionPool.get_connection()`` raised TypeError on each request, which the adapters caught
and let through unlimited. So the round trip here sends one debit for a scratch identity
through ``Limiter.take``, the call every decision makes, checks that the reply adds up, and
deletes the scratch key again. The scratch identity's key is new each time
(``<prefix>:{check.<random>}``) and holds one bucket of a one-second rule, so even a delete
that does not reach Redis leaves nothing for more than about a second.

No database query: the scratch rule is built here, not loaded, so the check also runs before
``migrate``.
"""

import secrets
import time
from pathlib import Path
from typing import NamedTuple

from ..config.snapshot import CompiledRule
from ..decision.buckets import Bucket
from ..decision.keys import bucket_key
from ..stores import StoreMisconfigured, StoreUnavailable

__all__ = ["RoundTrip", "OK", "UNAVAILABLE", "MISCONFIGURED", "UNEXPECTED",
           "decision_round_trip", "describe_error"]

OK, UNAVAILABLE, MISCONFIGURED, UNEXPECTED = "ok", "unavailable", "misconfigured", "unexpected"

# burst 2, one token a second: a debit of 1 leaves exactly one token (1000 units)
_SCRATCH_RULE = CompiledRule(id=1, name="ratelimit_app check", scope="ip", plan=None,
                             endpoint="", rate=1, period_s=1, burst=2, shadow=False,
                             fail_open=None)


class RoundTrip(NamedTuple):
    """What a scratch decision gave. ``outcome`` is OK, UNAVAILABLE (Redis did not answer),
    MISCONFIGURED (Redis refused what the limiter sends) or UNEXPECTED (any other exception, or
    an answer that does not add up: a bug or a library incompatibility); ``detail`` says what
    happened, e.g. "TypeError: ... (raised at ratelimit_app/stores/connections.py:67)"."""

    outcome: str
    detail: str
    elapsed_ms: float


def decision_round_trip(limiter):
    """Debit one token of a scratch identity through ``limiter.take`` (the store path every
    decision uses), check the reply, delete the scratch key. Returns a RoundTrip; raises
    nothing but interrupts."""
    prefix = limiter.config["KEY_PREFIX"]
    bucket = Bucket(_SCRATCH_RULE, bucket_key(prefix, f"check.{secrets.token_hex(8)}"), 1)
    started = time.perf_counter()
    try:
        reply = limiter.take((bucket,))
    except Exception as error:
        try:  # a take that failed after it was sent may have written the key
            limiter.store.delete([bucket.key])
        except Exception:
            pass  # reported below as the take's error; the key expires within a second
        return _failed(error, started)
    try:
        limiter.store.delete([bucket.key])
    except Exception as error:
        return _failed(error, started)
    expected_level = bucket.capacity_units - bucket.cost_units
    if not reply.allowed or list(reply.results) != [1] or \
            list(reply.levels) != [expected_level]:
        return RoundTrip(UNEXPECTED, f"the store answered allowed={reply.allowed}, results="
                                     f"{list(reply.results)}, levels={list(reply.levels)} to a "
                                     f"debit of a full bucket (expected True, [1], "
                                     f"[{expected_level}])", _ms_since(started))
    return RoundTrip(OK, "a scratch decision was allowed and its key deleted",
                     _ms_since(started))


def _failed(error, started):
    """Return the RoundTrip of a call that raised ``error``."""
    if isinstance(error, StoreMisconfigured):
        return RoundTrip(MISCONFIGURED, str(error), _ms_since(started))
    if isinstance(error, StoreUnavailable):
        return RoundTrip(UNAVAILABLE, str(error), _ms_since(started))
    # what the adapters would catch on every request
    return RoundTrip(UNEXPECTED, describe_error(error), _ms_since(started))


def describe_error(error):
    """Return ``error``'s type and message, and the file and line that raised it, e.g.
    "TypeError: ... (raised at ratelimit_app/stores/connections.py:67)"."""
    traceback = error.__traceback__
    where = ""
    if traceback is not None:
        while traceback.tb_next is not None:
            traceback = traceback.tb_next
        parts = Path(traceback.tb_frame.f_code.co_filename).parts
        # from the package's folder on: ratelimit_app/..., redis/..., django_redis/...
        for top in ("site-packages", "dist-packages"):
            if top in parts:
                parts = parts[len(parts) - parts[::-1].index(top):]
                break
        else:
            if "ratelimit_app" in parts:
                parts = parts[len(parts) - 1 - parts[::-1].index("ratelimit_app"):]
        shown = "/".join(parts[-4:])
        where = f" (raised at {shown}:{traceback.tb_lineno})"
    return f"{type(error).__name__}: {error}{where}"


def _ms_since(started):
    return round((time.perf_counter() - started) * 1000, 2)
