"""The ledger's Lua scripts on one balance key (decision/balances.py: five little-endian int64
``granted, spent, used, period_start_ms, seq``, no TTL). Each touches one key, so it runs on a
single node and on a Cluster alike (routed by its key), atomically with the request path's
take/settle/refund of that balance.

Both are given the account row's state (``BalanceState.pack()``) and reply with numbers, never
the packed value, so a client decoding replies as text reads them too.
"""

__all__ = ["APPLY_TOP_UP", "CHECKPOINT", "UNCHANGED", "SEEDED", "RESTORED", "RAISED"]

# The outcomes CHECKPOINT replies first.
UNCHANGED, SEEDED, RESTORED, RAISED = 0, 1, 2, 3

# After a top-up committed. KEYS[1]: the balance key. ARGV[1]: the account row as read after
# the commit (its granted is the new total). The balance present: granted = max(stored,
# the row's), seq + 1 when it rose. Missing (or not a balance): set to the row's state, as the
# request path's seed would, so that a seed that read the row before the commit cannot set a
# balance without this top-up. Replies 1 when it wrote, 0 when not.
APPLY_TOP_UP = """
local value = redis.call('GET', KEYS[1])
if not value or #value ~= 40 then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
local granted, spent, used, start, seq = struct.unpack('<i8i8i8i8i8', value)
local total = struct.unpack('<i8', ARGV[1])
if total <= granted then return 0 end
redis.call('SET', KEYS[1], struct.pack('<i8i8i8i8i8', total, spent, used, start, seq + 1))
return 1
"""

# The checkpoint of one balance. KEYS[1]: the balance key. ARGV[1]: the account row's state
# (the last checkpoint, with the ledger's granted).
# - missing (or not a balance): set to the row's state (SEEDED);
# - its seq below the row's: Redis lost writes (a failover, a restore from an older copy): the
#   row's state is set back, granted the larger of the two (RESTORED);
# - else its granted below the row's (a top-up whose apply failed): raised, seq + 1 (RAISED);
# - else left as it is (UNCHANGED).
# Replies {outcome, granted, spent, used, period_start_ms, seq} of the balance now.
CHECKPOINT = """
local row = ARGV[1]
local rg, rs, ru, rp, rq = struct.unpack('<i8i8i8i8i8', row)
local value = redis.call('GET', KEYS[1])
if not value or #value ~= 40 then
  redis.call('SET', KEYS[1], row)
  return {1, rg, rs, ru, rp, rq}
end
local g, s, u, p, q = struct.unpack('<i8i8i8i8i8', value)
if q < rq then
  g = math.max(g, rg)
  redis.call('SET', KEYS[1], struct.pack('<i8i8i8i8i8', g, rs, ru, rp, rq))
  return {2, g, rs, ru, rp, rq}
end
if g < rg then
  redis.call('SET', KEYS[1], struct.pack('<i8i8i8i8i8', rg, s, u, p, q + 1))
  return {3, rg, s, u, p, q + 1}
end
return {0, g, s, u, p, q}
"""
