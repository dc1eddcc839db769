"""Ban checks folded into a token bucket's argument of the same take.lua call.

A ban's check (decision/buckets.BanGate) is, as the engine builds it, one more entry of the
call: a key, a 4-byte argument, a reply entry. Redis pays about 0.4 µs for each, a tenth of a
4-level decision for two ban rules, though a caller is almost never banned. So a store sends
each ban check inside the argument of a token bucket of the same call (the first one, the
"host"): the gate record's id and the index of the key that holds it, that key being one of
the call's keys already (the user's ban lives in the user's key) or one added after the config
version's key, read and never written. take.lua then reports a folded check only in its full
reply, after the buckets' entries; ``FoldedTake.unfold`` puts every entry back in the engine's
order, so nothing above the store sees the difference.

A call without a ban check, or without a token bucket to carry one (a Cluster slot group
holding only the client IP's key), is sent as the engine built it.
"""

import struct

from .base import TAKE_HEAD, TakeReply

__all__ = ["FoldedTake", "fold_ban_checks", "folded_call", "BAN_CHECK_FULL"]

_BAN_CHECK_SIZE = 4  # a ban check's argument: its gate record's id (buckets.BanGate)
_TOKEN_BUCKET_SIZE = 48  # six int64, the mode last (buckets._SPEC)
_MODE = struct.Struct("<q")
_HOST_MODES = frozenset((-1, 0, 1, 2))  # checked, shadow, enforced, gate: token buckets
_FOLDED = struct.Struct("<4si")  # the gate record's id, the 1-based index of its key in KEYS
# take.lua's GATE: a ban check's level while no ban is in force
BAN_CHECK_FULL = 1000


class FoldedTake:
    """take.lua's keys and arguments with the ban checks folded into a host bucket's argument.

    ``keys``: the buckets' keys still sent as entries; ``extra_keys``: keys only a folded check
    reads, sent after the version key; ``args``: take.lua's ARGV. ``unfold`` turns the reply to
    these into the reply to the call as the engine built it."""

    __slots__ = ("keys", "extra_keys", "args", "_order", "_count")

    def __init__(self, keys, extra_keys, args, order):
        self.keys, self.extra_keys, self.args = keys, extra_keys, args
        self._order = order  # the engine's index of each reply entry, folded checks last
        self._count = len(order)

    def unfold(self, reply):
        """Return ``reply`` (a TakeReply to the folded call) with an entry per bucket in the
        engine's order. The common reply carries no folded check: none was in force."""
        levels, results = [BAN_CHECK_FULL] * self._count, [1] * self._count
        for index, level, result in zip(self._order, reply.levels, reply.results):
            levels[index], results[index] = level, result
        return TakeReply(reply.allowed, reply.version, levels, results)


def fold_ban_checks(bucket_keys, args):
    """Return the FoldedTake of take.lua's call on ``bucket_keys`` with ``args`` (a version key
    follows the keys), or None when it has no ban check or no token bucket to carry one."""
    specs = args[TAKE_HEAD:]
    checks = [i for i, spec in enumerate(specs) if len(spec) == _BAN_CHECK_SIZE]
    if not checks:
        return None
    hosts = [i for i, spec in enumerate(specs) if len(spec) == _TOKEN_BUCKET_SIZE
             and _MODE.unpack_from(spec, 40)[0] in _HOST_MODES]
    if not hosts:
        return None
    # a host in a checked key if there is one: take.lua skips the search in the host's own
    # key when it holds the host's record alone (no ban record)
    checked_keys = {bucket_keys[i] for i in checks}
    host = next((i for i in hosts if bucket_keys[i] in checked_keys), hosts[0])
    folded = set(checks)
    kept = [i for i in range(len(specs)) if i not in folded]
    keys = tuple([bucket_keys[i] for i in kept])
    host_at = kept.index(host)
    position = {bucket_keys[host]: host_at + 1}  # a key's 1-based index in KEYS
    for index, key in enumerate(keys, 1):
        position.setdefault(key, index)
    extra_keys = []
    carried = []
    for i in checks:
        key = bucket_keys[i]
        if key not in position:  # after the buckets' keys and the version key
            extra_keys.append(key)
            position[key] = len(keys) + 1 + len(extra_keys)
        carried.append(_FOLDED.pack(specs[i], position[key]))
    wire_specs = [specs[i] for i in kept]
    wire_specs[host_at] = specs[host] + b"".join(carried)
    return FoldedTake(keys, tuple(extra_keys), (*args[:TAKE_HEAD], *wire_specs),
                      tuple(kept + checks))


def folded_call(bucket_keys, args, version_key):
    """Return ``(keys, args, fold)``: take.lua's KEYS and ARGV for the engine's ``bucket_keys``
    and ``args`` with the version key, as sent, and the FoldedTake the reply is to be unfolded
    by (None: sent as built)."""
    fold = fold_ban_checks(bucket_keys, args)
    if fold is None:
        return (*bucket_keys, version_key), args, None
    return (*fold.keys, version_key, *fold.extra_keys), fold.args, fold
