"""A bucket a request is charged against, and the status it reports after a decision.

Units (shared with ``stores/lua/take.lua``): one token is ``period_ms`` units, so a rule of
``rate`` tokens per period refills exactly ``rate`` units per millisecond and all math stays in
integers.
"""

import functools
import math
import struct
from collections.abc import Sequence
from typing import NamedTuple

from . import periods
from .balances import NEVER_MS, account_ref, balance_key
from .header_fields import policy_item, sf_string

__all__ = ["Bucket", "BanGate", "CheckedBucket", "CredentialProof", "CalendarQuota",
           "ConcurrencySlot", "CreditBalance", "CreditStatus",
           "PolicyStatus", "LevelStatuses", "pack_value", "unpack_value", "read_state",
           "CALENDAR_RECORD", "NEXT_PERIOD"]

# A key's stored value, as take.lua writes it: the key's expiry (ms), then one record per
# bucket of that identity: rule id, level, timestamp_ms, period_ms.
_EXPIRY = struct.Struct("<q")
_RECORD = struct.Struct("<iqqq")
# take.lua's per-bucket argument: rule id, period_ms, capacity, refill per ms, cost, mode
_SPEC = struct.Struct("<qqqqqq")
# a calendar quota's: rule id, period start, N, next start, cost, mode, the start after next
_CALENDAR_SPEC = struct.Struct("<qqqqqqq")
# A ban's check: its gate record's id as take.lua stores record ids (take.lua's GATE is the
# gate's capacity and cost, BanGateRule's one token of 1,000 units refilling 1 unit per ms)
_BAN_CHECK = struct.Struct("<i")
# take.lua's period_ms of a calendar quota's record (used units, period start, this)
CALENDAR_RECORD = -1
# added by take.lua to a calendar quota's level counted in the period after the one sent
NEXT_PERIOD = 2**52


def pack_value(states, expires_at_ms=0):
    """Return a key's value as take.lua stores it (for tests and tools): ``states`` maps rule
    ids to ``(level_units, stamp_ms, period_ms)``. An expiry of 0 makes the next debit set the
    key's TTL."""
    return _EXPIRY.pack(int(expires_at_ms)) + b"".join(
        _RECORD.pack(rule_id, int(level), int(stamp), int(period))
        for rule_id, (level, stamp, period) in states.items())


def unpack_value(value):
    """Return ``(expires_at_ms, {rule id: (level_units, stamp_ms, period_ms)})`` of a key's
    stored value."""
    records = {}
    for offset in range(_EXPIRY.size, len(value), _RECORD.size):
        rule_id, level, stamp, period = _RECORD.unpack_from(value, offset)
        records[rule_id] = (level, stamp, period)
    return _EXPIRY.unpack_from(value)[0], records


def read_state(value, rule_id):
    """Return ``(level_units, stamp_ms, period_ms)`` of rule ``rule_id``'s bucket in a key's
    stored value, or None when the key holds none (the bucket is full)."""
    return unpack_value(value)[1].get(rule_id) if value else None


class PolicyStatus(NamedTuple):
    """The state of one bucket after a decision, as the headers and the dashboard show it.

    (A NamedTuple rather than a dataclass: one is built per bucket per request.)
    """

    name: str
    quota: int          # tokens per window (the rule's rate)
    window_s: int       # the rule's period
    burst: int
    remaining: int      # whole tokens left
    reset_s: int        # seconds until the next whole token (if short: until this request's cost)
    full_s: int         # seconds until the bucket is full again
    cost: int
    shadow: bool
    short: bool         # did not hold the cost (a denial, or a would-be denial if shadow)
    key: str
    level_units: int    # exact level in the script's units
    scope: str = ""     # the rule's scope: shared buckets' levels are not shown by default
    # the headers' parts that depend on the rule alone, built once per bucket (header_fields.py;
    # "": built when a response needs them)
    header_name: str = ""   # the name as an RFC 9651 sf-string
    policy_item: str = ""   # this policy as a RateLimit-Policy list member


@functools.lru_cache(maxsize=4096)
def _spec(rule_id, period_ms, burst, rate, cost, mode):
    # Encoded once per (rule, numbers, cost, mode): the same few strings serve every request,
    # and the script reads them with one struct.unpack instead of five tonumber calls.
    return _SPEC.pack(rule_id, period_ms, burst * period_ms, rate, cost * period_ms, mode)


# take.lua's bucket modes
ENFORCE, SHADOW, GATE = 1, 0, 2
CALENDAR_ENFORCE, CALENDAR_SHADOW = 3, 4
CONCURRENCY_ENFORCE, CONCURRENCY_SHADOW = 5, 6
CREDITS_ENFORCE, CREDITS_SHADOW = 7, 8
CREDENTIAL_PROOF = 9
BAN = -1


class Bucket:
    """One rule's bucket for one scope value, and the tokens this request costs in it."""

    __slots__ = ("rule", "key", "id", "cost", "gate", "period_ms", "capacity_units", "cost_units",
                 "spec", "shown", "short_below")

    def __init__(self, rule, key, cost, gate=False, proven=False):
        self.rule = rule        # config.snapshot.CompiledRule
        self.key = key          # the identity's key: its other buckets are records in it too
        # this bucket alone (local caches key on it); a gate a credential's proof precedes
        # apart: what the deny cache learns of it does not hold for unproven callers
        self.id = f"{key}:{rule.id}:proven" if proven else f"{key}:{rule.id}"
        self.cost = cost        # tokens
        # a gate is checked but never debited: a request needs ``cost`` tokens in it to pass
        # (the failed-authentication buckets of a client IP, which only failures debit)
        self.gate = gate
        self.period_ms = period_ms = rule.period_s * 1000
        self.capacity_units = rule.burst * period_ms
        self.cost_units = cost * period_ms
        self.short_below = _short_below(rule, self.cost_units)
        # take.lua's argument for this bucket (see _spec)
        mode = GATE if gate else SHADOW if rule.shadow else ENFORCE
        self.spec = _spec(rule.id, period_ms, rule.burst, rule.rate, cost, mode)
        # what every PolicyStatus of this bucket repeats (see status)
        self.shown = (rule.name, rule.rate, rule.period_s, rule.burst, cost, rule.shadow,
                      key, rule.scope, sf_string(rule.name),
                      policy_item(rule.name, rule.burst, rule.rate, rule.period_s))

    def __repr__(self):
        return f"Bucket({self.rule.name!r}, {self.key!r}, cost={self.cost})"

    def status(self, level_units, short):
        """Return the PolicyStatus of this bucket holding ``level_units``."""
        # One per bucket per request: the rule's fields come from ``shown`` (built once per
        # bucket, and buckets are memoised per snapshot) and the tuple is made without
        # NamedTuple's Python-level __new__ (together about 0.4 µs of 0.9 µs per bucket).
        name, refill, period_s, burst, cost, shadow, key, scope, header_name, item = self.shown
        period_ms, capacity = self.period_ms, self.capacity_units
        per_s = refill * 1000  # units refilled per second
        if short:
            waited = self.cost_units - level_units
        else:
            # until the next whole token: within it the client can spend no more than the whole
            # tokens it holds (a full bucket gains its next token one token-time after a spend)
            waited = period_ms - level_units % period_ms
        # ceil(a / b) as -(-a // b): exact in integers, and cheaper than math.ceil of a division
        remaining, reset_s = level_units // period_ms, -(-waited // per_s)
        if remaining < 0:  # in debt (a settle charged more than it held): nothing left
            remaining = 0
        full_s = -((level_units - capacity) // per_s) if level_units < capacity else 0
        if type(level_units) is not int:
            # a projected level (the deny cache's, a lease's) is a float; Redis's are whole units
            level_units, remaining, reset_s, full_s = map(
                int, (level_units, remaining, reset_s, full_s))
        return _new_status(PolicyStatus, (
            name, refill, period_s, burst, remaining, reset_s, full_s,
            cost, shadow, short, key, level_units, scope, header_name, item,
        ))

    def rate_limit_item(self, level_units):
        """Return this bucket's RateLimit list member holding ``level_units`` (whole units, not
        short of the cost): ``status(level_units, False)``'s name, remaining and reset, without
        building the status (see LevelStatuses)."""
        period_ms = self.period_ms
        remaining = level_units // period_ms
        reset_s = -(-(period_ms - level_units % period_ms) // (self.rule.rate * 1000))
        return f"{self.shown[8]};r={remaining};t={reset_s}"


# PolicyStatus's fields in order, without the generated __new__'s keyword handling
_new_status = tuple.__new__


class LevelStatuses(Sequence):
    """The statuses of an allowed decision that no bucket was short for, on plain token buckets
    and credit balances (``engine.PlannedBuckets.plain``), each status built only when first
    read.

    The headers and the metrics, which read every decision, take what they need from
    ``planned`` (the PlannedBuckets: what depends on the rules alone, worked out once per bucket
    plan) and ``levels`` (the reply's, in the buckets' order) instead: building a status per
    bucket was about a fifth of ours' Python per request. Anything else reads it as the tuple of
    statuses it stands for (``request.ratelimit.policies``, the alerts, a test): it iterates,
    indexes, compares and hashes like that tuple.
    """

    __slots__ = ("planned", "levels", "_statuses")

    def __init__(self, planned, levels):
        self.planned = planned
        self.levels = levels
        self._statuses = None

    def statuses(self):
        """Return the statuses as a tuple (built on the first call; a race builds it twice)."""
        statuses = self._statuses
        if statuses is None:
            statuses = self._statuses = tuple([
                bucket.status(level, False) for bucket, level in zip(self.planned, self.levels)])
        return statuses

    def __len__(self):
        return len(self.planned)

    def __getitem__(self, index):
        return self.statuses()[index]

    def __iter__(self):
        return iter(self.statuses())

    def __eq__(self, other):
        if isinstance(other, LevelStatuses):
            other = other.statuses()
        return self.statuses() == other

    def __hash__(self):
        return hash(self.statuses())

    def __repr__(self):
        return repr(self.statuses())


class CheckedBucket(Bucket):
    """A bucket a request needs one token in but does not spend (take.lua's mode -1): what
    spends it comes later, outside the decision (a ban's, a rule counting responses'). Refuses
    like a gate; a credential's proof never lets it pass; while it holds its token the common
    reply stays the short one."""

    __slots__ = ()

    def __init__(self, rule, key):
        super().__init__(rule, key, 1, gate=True)
        self.spec = _SPEC.pack(rule.id, self.period_ms, self.capacity_units, rule.rate,
                               self.cost_units, BAN)


class BanGate(CheckedBucket):
    """A caller's ban by one ban rule (protection/bans.py), checked in the decision's take.lua
    call: ``rule`` is the ban rule's BanGateRule (one token a second, capacity one), so its
    level counts in ms and is short exactly while the ban lasts; no record (no ban) reads as
    full. Its spec is the gate record's id alone (take.lua knows the gate's numbers): the check
    of a caller with no ban costs Redis a string search, not a bucket's arithmetic."""

    __slots__ = ()

    def __init__(self, rule, key):
        super().__init__(rule, key)
        self.spec = _BAN_CHECK.pack(rule.id)


class CredentialProof(Bucket):
    """Whether a credential was used from a client address lately: checked just before that
    address's failed-authentication gates, in the same take.lua call (mode 9), so a credential
    proven from the address passes those gates even while others' failures there emptied them.

    ``rule`` is the address's first failed-auth rule (this entry reports under it, but is never
    shown: it is a gate's companion); ``key`` the proof's own key in the address's slot;
    ``memory_s`` how long a use proves the credential. Never short, never settled.
    """

    __slots__ = ()

    def __init__(self, rule, key, memory_s):
        super().__init__(rule, key, 0, gate=True)
        self.id = key
        self.capacity_units = self.cost_units = 0
        self.short_below = -math.inf
        self.spec = _SPEC.pack(0, int(memory_s * 1000), 0, 0, 0, CREDENTIAL_PROOF)

    def __repr__(self):
        return f"CredentialProof({self.key!r})"

    def status(self, level_units, short):
        """Return a PolicyStatus of this proof (never short: it refuses nothing)."""
        return super().status(0, False)


def _short_below(rule, cost_units):
    """Return a bucket's ``short_below``: the level (units) under which it refuses a request of
    its cost; -inf for a shadow rule's, which refuses nothing (see DenyCache.learn)."""
    return -math.inf if rule.shadow else cost_units


@functools.lru_cache(maxsize=4096)
def _calendar_spec(rule_id, limit, cost, mode, bounds):
    return _CALENDAR_SPEC.pack(rule_id, bounds.start_ms, limit, bounds.next_ms, cost, mode,
                               bounds.after_ms)


class CalendarQuota(Bucket):
    """A calendar quota: N units (``rule.rate``) per day or month, counted in take.lua's
    calendar records. Its units are plain units (one per token), and its spec depends on the
    period: ``spec`` is None and ``spec_at`` gives it for a moment (see engine.take_args)."""

    __slots__ = ()

    def __init__(self, rule, key, cost):
        super().__init__(rule, key, cost)
        self.period_ms = 1  # one unit per token: the level is the units left
        self.capacity_units = rule.rate
        self.cost_units = cost
        self.short_below = _short_below(rule, cost)
        self.spec = None
        # (no RateLimit-Policy member: its window is the period's length, which varies)
        self.shown = (rule.name, rule.rate, 0, rule.rate, cost, rule.shadow, key, rule.scope,
                      sf_string(rule.name), "")

    def spec_at(self, at_ms, slot_id=0):
        """Return take.lua's argument for a call at ``at_ms`` (this host's clock)."""
        rule = self.rule
        bounds = periods.bounds_at(rule.calendar, at_ms - periods.CLOCK_MARGIN_MS)
        return _calendar_spec(rule.id, rule.rate, self.cost_units,
                              CALENDAR_SHADOW if rule.shadow else CALENDAR_ENFORCE, bounds)

    def status(self, level_units, short):
        """Return the PolicyStatus of this quota holding ``level_units`` (as take.lua reports
        it): q = N, w = the period's length, r = units left, t = seconds to its end."""
        name, limit, _, _, cost, shadow, key, scope, header_name, _ = self.shown
        now = periods.now_ms()
        bounds = periods.bounds_at(self.rule.calendar, now - periods.CLOCK_MARGIN_MS)
        if level_units >= NEXT_PERIOD:  # Redis counted it in the next period
            level_units -= NEXT_PERIOD
            start, ends = bounds.next_ms, bounds.after_ms
        else:
            start, ends = bounds.start_ms, bounds.next_ms
        reset_s = max(0, math.ceil((ends - now) / 1000))
        return _new_status(PolicyStatus, (
            name, limit, (ends - start) // 1000, limit, int(level_units), reset_s,
            reset_s if level_units < limit else 0, cost, shadow, short, key, int(level_units),
            scope, header_name, "",
        ))


# the RateLimit ``t`` of a concurrency limit (see ConcurrencySlot.status)
SLOT_RESET_S = 1


class ConcurrencySlot(Bucket):
    """A concurrency limit: at most N (``rule.rate``) requests of one scope value in flight.

    Its key is a sorted set beside the identity's key, in the same ``{tag}`` (so in the same
    Cluster slot and the same take.lua call): one member per request in flight (its slot id, 8
    bytes), scored with the slot's deadline (ms, the script's clock: now + the rule's timeout,
    ``rule.period_s``). take.lua drops the members past their deadline, then adds this request's
    if fewer than N remain, all in the decision's one atomic call; the adapter releases it (ZREM,
    idempotent) when the response is finished. Units are slots: the level is the slots free.
    Its spec carries the request's slot id, so ``spec`` is None and ``spec_at`` builds it.
    """

    __slots__ = ()

    def __init__(self, rule, key, cost):
        super().__init__(rule, f"{key}:inflight:{rule.id}", 1)  # a request takes one slot
        self.period_ms = 1
        self.capacity_units = rule.rate
        self.cost_units = 1
        self.short_below = _short_below(rule, 1)
        self.spec = None
        # window_s = 0: no window (headers.py then names the unit, qu="concurrent-requests")
        self.shown = (rule.name, rule.rate, 0, rule.rate, 1, rule.shadow, self.key, rule.scope,
                      sf_string(rule.name), policy_item(rule.name, rule.rate, rule.rate, 0))

    def spec_at(self, at_ms, slot_id=0):
        """Return take.lua's argument: rule id, timeout_ms, N, slot id, 1, mode."""
        rule = self.rule
        return _SPEC.pack(rule.id, rule.period_s * 1000, rule.rate, slot_id, 1,
                          CONCURRENCY_SHADOW if rule.shadow else CONCURRENCY_ENFORCE)

    def status(self, level_units, short):
        """Return the PolicyStatus of this limit with ``level_units`` slots free: q = N,
        r = slots free, t = 1 s (see below)."""
        name, limit, _, _, cost, shadow, key, scope, header_name, item = self.shown
        level = int(level_units)
        # draft-11's t is the seconds until additional quota is made available. A slot comes
        # back when a request in flight finishes, which may be any moment: 1 s, the field's
        # smallest step above 0, whether or not a slot is free (all free, r = q, included).
        # Never 0: that would say more is free right now, so a client following r within t
        # could send any number of requests at once.
        return _new_status(PolicyStatus, (
            name, limit, 0, limit, level, SLOT_RESET_S, 0, cost, shadow, short, key, level,
            scope, header_name, item,
        ))


def slot_member(slot_id):
    """Return the sorted-set member of slot ``slot_id`` as take.lua writes it (its 8 bytes)."""
    return struct.pack("<q", slot_id)


class CreditStatus(PolicyStatus):
    """The status of a credit balance: a PolicyStatus that the RateLimit headers leave out (a
    balance is not a rate: a refusal for it is a 402, see headers.problem_body)."""

    __slots__ = ()


# what a credit balance may hold, as far as the deny cache and the settle's clamp know: any
# level (an int64 with room for a debt bound on top)
UNBOUNDED_UNITS = 2**62

# a never-refilled balance's period: one, from the epoch to a moment no clock reaches
_NEVER = periods.Bounds(0, NEVER_MS, NEVER_MS)


class CreditBalance(Bucket):
    """A prepaid credit balance (``rule.credits``): the account's top-ups, plus an allowance of
    ``rule.rate`` units given once or each day or month (``rule.refill``) and spent first.

    Its key is the account's balance key beside the identity's key (decision/balances.py), read
    and debited in the decision's one atomic call like every bucket; take.lua replies that it is
    missing (first use, or Redis lost it) and the Limiter seeds it from the ledger, then decides
    again. Units are plain units (one per token): the level is the units left, below 0 only in
    debt. ``account`` names the account (``key:12``) for the ledger.
    """

    __slots__ = ("account",)

    def __init__(self, rule, key, cost, identity):
        # (not Bucket's __init__: an allowance of 0 has no token-bucket numbers to work out)
        self.rule, self.key, self.cost, self.gate = rule, balance_key(key), cost, False
        self.id = f"{self.key}:{rule.id}"
        self.account = account_ref(rule.scope, identity)
        self.period_ms = 1
        # a top-up may raise a balance at any moment: the deny cache never learns one
        # (short_below), and never projects one short (its capacity, "unknown", is unbounded)
        self.capacity_units = UNBOUNDED_UNITS
        self.cost_units = cost
        self.short_below = -math.inf
        # a never-refilled balance's argument is the same at every moment: built once, so the
        # decision's whole call is too (engine.PlannedBuckets.debit_args); a refilled one's
        # depends on the period (spec_at)
        self.spec = None if rule.refill else self.spec_at(0)
        self.shown = (rule.name, rule.rate, 0, rule.rate, cost, rule.shadow, self.key,
                      rule.scope, sf_string(rule.name), "")

    def bounds_at(self, at_ms):
        """Return the Bounds of the allowance's period at ``at_ms`` (this host's clock)."""
        if not self.rule.refill:
            return _NEVER
        return periods.bounds_at(self.rule.refill, at_ms - periods.CLOCK_MARGIN_MS)

    def spec_at(self, at_ms, slot_id=0):
        """Return take.lua's argument: rule id, period start, allowance, next start, cost, mode,
        the start after next (a calendar quota's layout)."""
        rule = self.rule
        return _calendar_spec(rule.id, rule.rate, self.cost_units,
                              CREDITS_SHADOW if rule.shadow else CREDITS_ENFORCE,
                              self.bounds_at(at_ms))

    def status(self, level_units, short):
        """Return the CreditStatus of this balance holding ``level_units``: remaining = units
        left (0 in debt), reset = seconds until the allowance is whole again (0: never)."""
        name, allowance, _, _, cost, shadow, key, scope, header_name, _ = self.shown
        level = int(level_units)
        reset_s = 0
        if self.rule.refill:
            now = periods.now_ms()
            reset_s = max(0, math.ceil((periods.bounds_at(self.rule.refill, now).next_ms - now)
                                       / 1000))
        return _new_status(CreditStatus, (
            name, allowance, 0, allowance, max(0, level), reset_s, 0, cost, shadow, short, key,
            level, scope, header_name, "",
        ))
