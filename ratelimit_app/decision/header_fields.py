"""The parts of the rate-limit headers that depend on a rule alone (its name, burst, rate and
period), not on a bucket's level: a bucket builds them once (``buckets.Bucket``), and every
response on that bucket reuses them (``headers.py``).
"""

import functools

__all__ = ["sf_string", "window_s", "policy_item"]


@functools.lru_cache(maxsize=4096)  # policy names come from the admin: few, and asked often
def sf_string(value):
    """Serialise an RFC 9651 sf-string (printable ASCII; quote and backslash escaped)."""
    text = "".join(c for c in value if " " <= c <= "~")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def window_s(burst, rate, period_s):
    """Return a bucket's ``w``: the whole seconds it takes to refill from empty, rounded up (a
    client keeping to q per w then spends at most the refill rate)."""
    return -(-burst * period_s // rate)


@functools.lru_cache(maxsize=4096)
def policy_item(name, burst, rate, period_s):
    """Return one policy as a member of the RateLimit-Policy list; ``period_s`` 0 is a
    concurrency limit (q requests in flight, no window)."""
    if not period_s:
        return f'{sf_string(name)};q={burst};qu="concurrent-requests"'
    return f"{sf_string(name)};q={burst};w={window_s(burst, rate, period_s)}"
