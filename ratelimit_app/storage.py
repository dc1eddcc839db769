"""The Redis connection (through django-redis), the loaded Lua script and error mapping.

Every Redis failure leaves this module as :class:`StorageUnavailable`; callers decide between
fail-open and fail-closed. A circuit breaker skips Redis entirely while it is known to be down.
"""

import logging
import secrets
import threading
import time
from importlib import resources

from redis.exceptions import RedisError

from . import keys
from .breaker import CircuitBreaker
from .conf import get_config

__all__ = ["StorageUnavailable", "run_take", "get_client", "read_config_version",
           "bump_config_version", "delete_keys", "breaker", "stats"]

logger = logging.getLogger("ratelimit_app")


class StorageUnavailable(Exception):
    """Redis could not give an answer (down, slow, restarting, or the breaker is open)."""


class _Stats:
    """Process-wide counters read by the dashboard and the Prometheus endpoint."""

    def __init__(self):
        self.redis_errors = 0
        self.breaker_skips = 0
        self.last_error = ""
        self.last_error_at = None
        self.last_latency_ms = None


stats = _Stats()
_lock = threading.Lock()
_state = {}


def _load():
    """Build the client, script and breaker once per process (and after settings change)."""
    with _lock:
        if not _state:
            from django_redis import get_redis_connection

            config = get_config()
            client = get_redis_connection(config["CACHE_ALIAS"])
            source = resources.files("ratelimit_app").joinpath("lua/take.lua").read_text()
            _state.update(
                client=client,
                # register_script runs EVALSHA and reloads the script on NOSCRIPT (after a
                # Redis restart or SCRIPT FLUSH), so the source is sent only when needed.
                take=client.register_script(source),
                breaker=CircuitBreaker(config["BREAKER_FAILURES"], config["BREAKER_COOLDOWN_S"]),
                version_key=keys.config_version_key(config["KEY_PREFIX"]),
            )
        return _state


def reset():
    """Forget the client, script and breaker (settings changed, or in tests)."""
    with _lock:
        _state.clear()


def get_client():
    """Return the redis-py client of the configured django-redis cache."""
    return _load()["client"]


def breaker():
    """Return this process's circuit breaker."""
    return _load()["breaker"]


def _guarded(operation):
    """Run ``operation(state)`` through the breaker, mapping Redis errors to StorageUnavailable."""
    state = _load()
    guard = state["breaker"]
    if not guard.allow_call():
        stats.breaker_skips += 1
        raise StorageUnavailable("circuit breaker open")
    started = time.perf_counter()
    try:
        result = operation(state)
    except RedisError as exc:
        guard.record_failure()
        stats.redis_errors += 1
        stats.last_error, stats.last_error_at = f"{type(exc).__name__}: {exc}", time.time()
        logger.warning("ratelimit_app: Redis unavailable (%s); breaker %s", exc, guard.state)
        raise StorageUnavailable(str(exc)) from exc
    guard.record_success()
    stats.last_latency_ms = (time.perf_counter() - started) * 1000
    return result


def run_take(bucket_keys, args):
    """Run take.lua on ``bucket_keys`` (the version key is appended) and return its reply."""
    return _guarded(lambda s: s["take"](keys=[*bucket_keys, s["version_key"]], args=args))


def read_config_version():
    """Return the current config version string ("0" when unset)."""
    value = _guarded(lambda s: s["client"].get(s["version_key"]))
    return value.decode() if value else "0"


def bump_config_version():
    """Give the config version a value never used before, so every worker reloads; return it.

    Workers reload whenever the version differs from the one their snapshot was built at, so
    a bump only has to be new. A counter is not enough: after FLUSHALL, a restore or a
    failover to a replica that missed the last bump, counting on from an older value can
    land on a number a worker already holds, and that worker would never load the edit. The
    value is the clock in ms (readable when debugging) plus 64 random bits.
    """
    version = f"{int(time.time() * 1000)}-{secrets.token_hex(8)}"
    _guarded(lambda s: s["client"].set(s["version_key"], version))
    return version


def delete_keys(bucket_keys):
    """Delete ``bucket_keys`` (one call) and return how many existed."""
    return _guarded(lambda s: s["client"].delete(*bucket_keys)) if bucket_keys else 0
