-- Give back, once, what take.lua debited from some buckets of a decision that was refused
-- elsewhere (on a Redis Cluster, another slot's call of the same decision refused it).
--
-- KEYS[1..n]  bucket keys (one slot), KEYS[n+1] the refund's marker key, in the same slot
--             (the buckets' {tag}); its name carries the refund id of the decision
-- ARGV[1]     how long the marker lives, in ms (longer than any retry of this refund)
-- ARGV[2..]   five values per bucket, exactly as take.lua got them: period_ms, capacity,
--             refill_per_ms, cost, mode (only period_ms, capacity and cost are used here)
--
-- Idempotent: the first call sets the marker (SET NX) and adds the cost back; a retried call
-- finds the marker and adds nothing. Never above capacity: a bucket refilled meanwhile stays
-- full. The stored layout is take.lua's (level, timestamp_ms, period_ms as three little-endian
-- int64); the timestamp and the TTL are kept: the level is the one at that timestamp, so the
-- next take refills from it exactly as if the debit had never happened. A missing key (or one
-- that is not ours) reads as full and is left alone.
--
-- Returns the buckets' levels after the call, in units of their period_ms.

local n = #KEYS - 1
local first_call = redis.call('SET', KEYS[n + 1], '1', 'NX', 'PX', ARGV[1])
local levels = {}

for i = 1, n do
  local a = 2 + (i - 1) * 5
  local period, capacity, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3])
  local level = capacity
  local value = redis.call('GET', KEYS[i])
  if value and #value == 24 then
    local stamp, p
    level, stamp, p = struct.unpack('<i8i8i8', value)
    if p ~= period then level = math.floor(level * period / p) end
    if first_call and level < capacity then
      level = math.min(capacity, level + cost)
      redis.call('SET', KEYS[i], struct.pack('<i8i8i8', level, stamp, period), 'KEEPTTL')
    end
    if level > capacity then level = capacity end
  end
  levels[i] = level
end
return levels
