"""The floor every Redis-backed limiter pays: a bare 4-key token-bucket script sent with EVALSHA
through the same django-redis connection as ours (no identity, no policy, no headers)."""

from pathlib import Path

from django_redis import get_redis_connection

LEVELS = 4
_script = None


def source():
    """Return the naive script's Lua source."""
    return (Path(__file__).parent / "naive_take.lua").read_text()


def script():
    """Return the registered naive script (loaded once per process)."""
    global _script
    if _script is None:
        _script = get_redis_connection("default").register_script(source())
    return _script


def naive_keys(client_id, levels=LEVELS):
    """Keys of a naive hierarchy for one client: global, plan, ip, endpoint, ..."""
    return [f"naive:{{{client_id}}}:{level}" for level in range(levels)]


def naive_args(levels=LEVELS):
    # 1,000,000 tokens per second each, so every call is allowed (the allowed path).
    return [1000, 1_000_000, 1] * levels


def take_naive(keys, args):
    """Run the naive script; return True if allowed."""
    return script()(keys=keys, args=args)[0] == 1
