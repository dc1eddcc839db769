-- Give back, once, what take.lua debited from some buckets of a decision that was refused
-- elsewhere (on a Redis Cluster, another slot's call of the same decision refused it).
--
-- KEYS[1..n]  bucket keys (one slot; buckets of one identity repeat their key), KEYS[n+1] the
--             refund's marker key, in the same slot (the buckets' {tag}); its name carries the
--             refund id of the decision
-- ARGV[1]     how long the marker lives, in ms (longer than any retry of this refund)
-- ARGV[2..]   one per bucket, exactly as take.lua got it: six little-endian int64, rule id,
--             period_ms, capacity, refill_per_ms, cost, mode (refill unused here), or a ban's
--             check (its gate record's id, an int32), read as the checked bucket it stands for.
--             A checked bucket (mode -1: take.lua only checks it, never debits it) is never
--             refunded: its level is read and reported, nothing is written.
--
-- Idempotent: the first call sets the marker (SET NX) and adds the cost back; a retried call
-- finds the marker and adds nothing. Never above capacity: a bucket refilled meanwhile stays
-- full. The stored layout is take.lua's (the key's expiry, then per bucket rule id, level,
-- timestamp_ms, period_ms); the timestamps and the TTL are kept: a level is the one at its
-- timestamp, so the next take refills from it exactly as if the debit had never happened (and a
-- higher level needs no longer TTL). A missing record (or a value that is not ours) reads as
-- full and is left alone.
--
-- Calendar quotas (mode 3 or 4, seven int64: rule id, start, N, next start, cost, mode, the
-- start after next): a record of the current or the next period (take.lua's CALENDAR record:
-- rule id, used, period start, -1) has the cost taken off its used units, never below 0; its
-- level is N - used, plus NEXT_PERIOD for the next period's, as take.lua reports it. A record
-- of an older period reads as 0 used and is left alone.
--
-- Concurrency limits (mode 5 or 6: rule id, timeout, N, slot id, 1, mode; their key a sorted
-- set): the slot the decision took is removed (idempotent in itself); the level is the slots
-- free.
--
-- Credit balances (mode 7 or 8, a calendar quota's seven int64; their key holds take.lua's
-- balance value): the consumption of the current or the next period lowered by the cost, never
-- below 0, the prepaid part first (as settle.lua refunds); the level is the units left.
--
-- Returns the buckets' levels after the call, in units of their period_ms.

local HEADER, RECORD = 8, 28
local GATE = 1000  -- a ban's gate (take.lua): capacity and cost in units, 1 unit per ms
local CALENDAR, NEXT_PERIOD = -1, 4503599627370496
local n = #KEYS - 1
local first_call = redis.call('SET', KEYS[n + 1], '1', 'NX', 'PX', ARGV[1])
local values, changed, levels = {}, {}, {}

for i = 1, n do
  local key = KEYS[i]
  local spec = ARGV[i + 1]
  if #spec == 4 then  -- take.lua's ban check (its gate record's id): as the gate it stands for
    spec = struct.pack('<i8i8i8i8i8i8', (struct.unpack('<i4', spec)), GATE, GATE, 1, GATE, -1)
  end
  local rule, period, capacity, next_start, cost, mode = struct.unpack('<i8i8i8i8i8i8', spec)
  local level = capacity
  local value = ''
  if mode > 6 then
    -- a credit balance (its own key; take.lua's value): the period's consumption lowered by
    -- the cost, never below 0, the prepaid part of it first
    local stored = redis.call('GET', key)
    if stored and #stored == 40 then
      local granted, spent, used, start, seq = struct.unpack('<i8i8i8i8i8', stored)
      if start == period or start == next_start then
        if first_call and used > 0 then
          local back = math.min(cost, used)
          local over = math.max(0, used - capacity)
          used = used - back
          spent = spent - over + math.max(0, used - capacity)
          redis.call('SET', key, struct.pack('<i8i8i8i8i8', granted, spent, used, start, seq + 1))
        end
        level = math.max(0, capacity - used) + granted - spent
      else
        level = capacity + granted - spent
      end
    end
  elseif mode > 4 then
    -- a concurrency limit's slot (its own sorted set): released, once or again (ZREM)
    redis.call('ZREM', key, string.sub(ARGV[i + 1], 25, 32))
    level = math.max(0, capacity - redis.call('ZCARD', key))
  else
    value = values[key]
    if value == nil then value = redis.call('GET', key) or ''; values[key] = value end
  end
  if #value >= HEADER + RECORD and (#value - HEADER) % RECORD == 0 then
    for at = HEADER + 1, #value, RECORD do
      local id, stored, stamp, p = struct.unpack('<i4i8i8i8', value, at)
      if id == rule and mode > 2 then
        if p == CALENDAR and (stamp == period or stamp == next_start) then
          local used = stored
          if first_call and used > 0 then
            used = math.max(0, used - cost)
            value = string.sub(value, 1, at - 1) .. struct.pack('<i4i8i8i8', rule, used, stamp, p)
              .. string.sub(value, at + RECORD)
            values[key], changed[key] = value, true
          end
          level = math.max(0, capacity - used)
          if stamp == next_start then level = level + NEXT_PERIOD end
        end
        break
      elseif id == rule then
        level = stored
        if p ~= period then level = p > 0 and math.floor(level * period / p) or capacity end
        if first_call and level < capacity and mode >= 0 then  -- (checked: never debited)
          level = math.min(capacity, level + cost)
          value = string.sub(value, 1, at - 1) .. struct.pack('<i4i8i8i8', rule, level, stamp, period)
            .. string.sub(value, at + RECORD)
          values[key], changed[key] = value, true
        end
        if level > capacity then level = capacity end
        break
      end
    end
  end
  levels[i] = level
end
for key in pairs(changed) do redis.call('SET', key, values[key], 'KEEPTTL') end
return levels
