"""The one place that knows how metrics are laid out in Redis: key names, hash fields, sorted-set
members and list entries, each written and parsed here and nowhere else.

Every key comes from ``keys.metrics_key``: no hash tag (but the usage keys'), and no command
touches two keys (but the rollup's claim), so the
layout works unchanged on Redis Cluster where the buckets live::

    <p>:m:c:<minute>                HASH "<dimension>|<name>|<outcome>" -> count  TTL retention
    <p>:m:ch:<hour>                 HASH the same per hour                        TTL retention + 1 h
    <p>:m:hot:<metric>:<minute>     ZSET identity -> tokens / denials / requests  TTL 1 h + 5 min
    <p>:m:hoth:<metric>:<hour>      ZSET the same per hour                        TTL retention + 1 h
    <p>:m:near:<minute>             ZSET near-limit sighting (JSON) -> unix time  TTL 15 min
    <p>:m:total                     HASH all-time counters (Prometheus)
    <p>:m:flushed_at                STRING unix time of the latest flush
    <p>:m:buffered                  LIST   JSON periods whose metrics were buffered    TTL retention
    <p>:m:{usage}:pending           HASH usage field (JSON) -> count, until rolled up   TTL 30 days
    <p>:m:{usage}:claimed:<batch>   HASH a pending hash a rollup claimed (RENAME)       TTL kept
    <p>:m:{usage}:claims            SET  the batch ids claimed and not yet deleted
    <p>:m:{usage}:added:<flusher>   STRING the last usage batch a flusher added       TTL 1 day
    <p>:m:who:<ref>:<hour>          HASH a key's or user's hour (caller_history.py)    TTL ~25 h

The usage keys share one hash tag (one Cluster slot) so that RENAME and the claim's SADD run in
one script (business/usage/rollup.py), and a flush's batch and its marker in another
(usage_batches.py).

A count is keyed in process by ``(dimension, name, outcome)``: ``dimension`` and ``outcome`` are
the app's own words (never contain ``|``); ``name`` is a rule, plan or endpoint name and may.
"""

import json

from ..decision import keys

__all__ = ["HOT_METRICS", "RESOLUTIONS", "counts_key", "hot_key", "near_key", "totals_key",
           "flushed_at_key", "buffered_key", "decode", "count_field", "parse_count_field",
           "identity_member", "parse_member", "near_entry", "parse_near_entry",
           "period_entry", "parse_period_entry", "usage_pending_key", "usage_claimed_key",
           "usage_claims_key", "usage_marker_key", "usage_field", "parse_usage_field",
           "caller_hour_key", "HISTORY_ALLOWED", "HISTORY_REFUSED", "history_units_field",
           "history_refused_field", "parse_history_field"]

HOT_METRICS = ("tokens", "denials", "requests")
# Resolution of a time slot -> (its length in seconds, key part of counts, key part of hot keys).
RESOLUTIONS = {"minute": (60, "c", "hot"), "hour": (3600, "ch", "hoth")}
_PERIOD_FIELDS = ("from", "to", "decisions", "dropped", "pid")


def decode(value):
    """Return a Redis reply value (bytes) as text."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# --- keys ---------------------------------------------------------------------------------------

def counts_key(prefix, resolution, slot):
    """Return the HASH of counts of one minute or hour (``slot`` = unix time // its length)."""
    return keys.metrics_key(prefix, RESOLUTIONS[resolution][1], slot)


def hot_key(prefix, metric, resolution, slot):
    """Return the ZSET of the top identities by ``metric`` (one of HOT_METRICS) in one slot."""
    return keys.metrics_key(prefix, RESOLUTIONS[resolution][2], metric, slot)


def near_key(prefix, minute):
    return keys.metrics_key(prefix, "near", minute)


def totals_key(prefix):
    return keys.metrics_key(prefix, "total")


def flushed_at_key(prefix):
    return keys.metrics_key(prefix, "flushed_at")


def buffered_key(prefix):
    return keys.metrics_key(prefix, "buffered")


def usage_pending_key(prefix):
    """Return the HASH the flushes add usage to (see views/usage.py) until a rollup claims it."""
    return keys.metrics_key(prefix, "{usage}", "pending")


def usage_claimed_key(prefix, batch_id):
    return keys.metrics_key(prefix, "{usage}", "claimed", batch_id)


def usage_claims_key(prefix):
    return keys.metrics_key(prefix, "{usage}", "claims")


def usage_marker_key(prefix, flusher):
    """Return the key holding the number of the last usage batch ``flusher`` added."""
    return keys.metrics_key(prefix, "{usage}", "added", flusher)


# --- count fields -------------------------------------------------------------------------------

def count_field(dimension, name, outcome):
    """Return the hash field of a count, e.g. ``"rule|free-ip|denied"``."""
    return f"{dimension}|{name}|{outcome}"


def parse_count_field(field):
    """Return ``(dimension, name, outcome)`` of a hash field (a name may contain ``|``)."""
    dimension, _, rest = decode(field).partition("|")
    name, _, outcome = rest.rpartition("|")
    return dimension, name, outcome


def usage_field(day, ref, tenant, rule, display, metric):
    """Return the hash field of one usage count (``metric``: units, allowed or refused). JSON:
    tenant, rule and display names may hold any character."""
    return json.dumps([day, ref, tenant, rule, display, metric], separators=(",", ":"))


def parse_usage_field(field):
    """Return ``(day, ref, tenant, rule, display, metric)``, or None if ``field`` is not one."""
    try:
        parsed = json.loads(decode(field))
    except ValueError:
        return None
    if not isinstance(parsed, list) or len(parsed) != 6 or \
            not all(isinstance(part, str) for part in parsed):
        return None
    return tuple(parsed)


# --- caller history (caller_history.py) ---------------------------------------------------------

HISTORY_ALLOWED, HISTORY_REFUSED = "allowed", "refused"


def caller_hour_key(prefix, ref, hour):
    """Return the HASH of one caller's hour (``ref``: ``key:<id>`` or ``user:<id>``, digits
    from the database, never request input)."""
    return keys.metrics_key(prefix, "who", ref, hour)


def history_units_field(rule):
    """Return the field of the units ``rule`` charged in a caller's hour."""
    return f"units|{rule}"


def history_refused_field(rule):
    """Return the field of the requests ``rule`` refused in a caller's hour."""
    return f"refused|{rule}"


def parse_history_field(field):
    """Return ``(kind, rule)`` of a caller-hour field: ("allowed", ""), ("refused", ""),
    ("units", rule) or ("refused", rule)."""
    kind, _, rule = decode(field).partition("|")
    return kind, rule


# --- hot-key members ----------------------------------------------------------------------------

def identity_member(identity):
    """Return the hot-key member of an identity: ``"<ref>|<plan>|<display>"``.

    ``ref`` (``Identity.ref``) is enough for the inspector to find the caller again; ``display``
    is what staff see (never a secret).
    """
    return f"{identity.ref}|{identity.plan or ''}|{identity.display}"


def parse_member(member):
    """Return ``(ref, plan, display)`` of a hot-key member."""
    ref, plan, display = (decode(member).split("|", 2) + ["", ""])[:3]
    return ref, plan, display


# --- near-limit sightings and buffered periods --------------------------------------------------

def near_entry(member, rule, remaining, burst):
    """Return the ZSET member of a near-limit sighting (its score is the unix time)."""
    return json.dumps([member, rule, remaining, burst])


def parse_near_entry(raw):
    """Return ``(member, rule, remaining, burst)``, or None if ``raw`` is not a sighting."""
    try:
        member, rule, remaining, burst = json.loads(raw)
    except (ValueError, TypeError):
        return None
    return member, rule, remaining, burst


def period_entry(period):
    """Return the LIST entry of a buffered period (a dict with the keys of _PERIOD_FIELDS)."""
    return json.dumps({name: period[name] for name in _PERIOD_FIELDS})


def parse_period_entry(raw):
    """Return the period dict of a LIST entry, or None if it is not one."""
    try:
        period = json.loads(raw)
        return {name: period[name] for name in _PERIOD_FIELDS}
    except (ValueError, TypeError, KeyError):
        return None
