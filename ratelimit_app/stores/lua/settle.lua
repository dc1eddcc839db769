-- Settle a decision once what its request really cost is known (after the response): add the
-- difference between that cost and what take.lua debited at admission to each bucket the
-- request was charged on, in one atomic call (one per slot group on a Cluster).
--
-- KEYS[1..n]  the buckets' keys, as take.lua got them (one slot)
-- ARGV[1]     now in milliseconds, or "" to use the Redis server clock (tests pass a value)
-- ARGV[2..]   one per bucket: take.lua's spec of it (six little-endian int64: rule id,
--             period_ms, capacity, refill_per_ms, cost, mode; a calendar quota's seven), then
--             two little-endian int64: the difference in units (> 0: a further debit, < 0: a
--             refund) and the debt bound in units (how far below empty a further debit may
--             take the bucket; what would go further is not charged)
--
-- Token buckets (mode 0 shadow, 1 enforce): refilled up to now exactly as take.lua does, then
-- the difference taken off: never below -debt, never above capacity. A bucket in debt refuses
-- every request (take.lua refuses any level below the cost) until the refill has repaid the debt
-- and brought the level back to the cost. The key lives until the bucket is full again, as
-- take.lua keeps it. A refund to a bucket whose key is gone (it was full) changes nothing.
-- Calendar quotas (mode 3, 4): the difference added to the units used in the record's period,
-- never below 0 and never above N + debt; a record of another period is that period's, and a
-- further debit then starts the current period's record.
-- Credit balances (mode 7, 8; take.lua's value: granted, spent, used, period start, seq): a
-- further debit comes from the allowance first, then from the prepaid units, never taking the
-- units left below -debt; a refund gives back what the period consumed (never more), the
-- prepaid units first, as if the request had cost less from the start. A missing balance is
-- left alone (the ledger's checkpoint holds what it had).
-- Concurrency limits (mode 5, 6) and gates (mode 2) are not settled: their units are not costs.
--
-- Not idempotent: a settle is sent once and never retried (a lost reply may have applied it).
-- Returns two numbers per key, in the order of KEYS: the level after the call (take.lua's units;
-- a calendar quota's N - used, plus NEXT_PERIOD in the next period; an unsettled bucket's level
-- is its capacity), then the units the call charged a credit balance (its change after the
-- bounds: what the ledger bills; 0 for a missing balance and for every other bucket).

local HEADER, RECORD, SLACK_MS = 8, 28, 1000
local CALENDAR, NEXT_PERIOD = -1, 4503599627370496
local unpack_, pack, sub, ceil, call = struct.unpack, struct.pack, string.sub, math.ceil, redis.call
local n = #KEYS
local now = ARGV[1] ~= '' and tonumber(ARGV[1])
if not now then
  local t = call('TIME')
  local us = t[2] + 0
  now = t[1] * 1000 + (us - us % 1000) / 1000
end

-- per key: its value, the expiry it holds (0: absent), and, once a record in it changed, the
-- time the key must live until
local values, expiries, needs = {}, {}, {}
local reply = {}
for i = 1, n do
  local key, arg = KEYS[i], ARGV[i + 1]
  local spec_size = #arg - 16
  local delta, debt = unpack_('<i8i8', arg, spec_size + 1)
  local rule, period, capacity, refill, cost, mode = unpack_('<i8i8i8i8i8i8', arg)
  local level, charged = capacity, 0
  if mode > 6 then
    local value = call('GET', key)
    if value and #value == 40 then
      local granted, spent, used, start, seq = unpack_('<i8i8i8i8i8', value)
      local current = now >= refill and refill or period
      if start ~= current then start, used = current, 0 end
      local free = capacity - used
      if free < 0 then free = 0 end
      local left = free + granted - spent
      local change = delta
      if change > 0 and change > left + debt then change = math.max(0, left + debt) end
      if change < 0 and -change > used then change = -used end
      -- the prepaid part of the period's consumption before and after
      local over, after = used - capacity, used + change - capacity
      if over < 0 then over = 0 end
      if after < 0 then after = 0 end
      used, spent, charged = used + change, spent + after - over, change
      call('SET', key, pack('<i8i8i8i8i8', granted, spent, used, start, seq + 1))
      free = capacity - used
      if free < 0 then free = 0 end
      level = free + granted - spent
    end
  elseif mode < 2 or mode == 3 or mode == 4 then
    local value = values[key]
    if value == nil then
      value = call('GET', key) or ''
      if #value < HEADER + RECORD or (#value - HEADER) % RECORD ~= 0 then value = '' end
      values[key] = value
      expiries[key] = value ~= '' and unpack_('<i8', value) or 0
    end
    local at  -- the offset of this rule's record
    for a = HEADER + 1, #value, RECORD do
      if unpack_('<i4', value, a) == rule then at = a; break end
    end
    local record, need  -- the new record, and when the key must live until (ms)
    if mode < 2 then
      -- a token bucket: refill as take.lua does, then settle
      local stamp = now
      if at then
        local stored, s, p = unpack_('<i8i8i8', value, at + 4)
        if p == CALENDAR then
          stored, s = capacity, now  -- a calendar record (the kind changed): full
        elseif p ~= period then
          stored = p > 0 and math.floor(stored * period / p) or capacity
        end
        level, stamp = stored, s
        if now > stamp then level, stamp = level + (now - stamp) * refill, now end
        if level > capacity then level = capacity end
      end
      if at or delta > 0 then
        level = level - delta
        if level < -debt then level = -debt end
        if level > capacity then level = capacity end
        record = pack('<i4i8i8i8', rule, level, stamp, period)
        need = stamp + ceil((capacity - level) / refill)
      end
    else
      -- a calendar quota: period = its start, capacity = N, refill = the next start
      local start, ends, used = period, refill, 0
      if now >= refill then start, ends = refill, unpack_('<i8', arg, 49) end
      if at then
        local u, s, p = unpack_('<i8i8i8', value, at + 4)
        if p == CALENDAR and s == start then used = u end
      end
      if at or delta > 0 then
        used = used + delta
        if used < 0 then used = 0 end
        if used > capacity + debt then used = capacity + debt end
        record = pack('<i4i8i8i8', rule, used, start, CALENDAR)
        need = ends
      end
      level = capacity - used
      if level < 0 then level = 0 end
      if start ~= period then level = level + NEXT_PERIOD end
    end
    if record then
      if value == '' then value = pack('<i8', 0) end
      if at then
        value = sub(value, 1, at - 1) .. record .. sub(value, at + RECORD)
      else
        value = value .. record
      end
      values[key] = value
      if not needs[key] or need > needs[key] then needs[key] = need end
    end
  end
  reply[2 * i - 1], reply[2 * i] = level, charged
end

for key, need in pairs(needs) do
  if need > expiries[key] then
    -- the key must outlive the expiry it holds (a bucket in debt refills for longer): re-arm it
    local expiry = need + SLACK_MS
    call('SET', key, pack('<i8', expiry) .. sub(values[key], HEADER + 1), 'PX',
         math.max(1, expiry - now))
  else
    call('SET', key, values[key], 'KEEPTTL')
  end
end
return reply
