-- All-or-nothing debit of several token buckets in one atomic call.
--
-- KEYS[1..n]  bucket keys; KEYS[n+1], if given, the config version counter (read, never
--             written here; on a Redis Cluster only a call in its slot can read it)
-- ARGV[1]     now in milliseconds, or "" to use the Redis server clock (tests pass a value)
-- ARGV[2]     "1" to debit, "0" to only look (simulator, inspector)
-- ARGV[3..]   five integers per bucket: period_ms, capacity, refill_per_ms, cost, mode
--             (mode 1 = enforce, 0 = shadow, 2 = gate: enforced, but only checked, never
--             debited; a request is refused while a gate bucket holds less than its cost)
--
-- Units: one token is period_ms units, so a rule of `rate` tokens per `period_ms` refills exactly
-- `rate` units per millisecond. Every quantity is an integer (below 2^53, exact in a Lua
-- double): nothing is rounded, so nothing drifts however often the bucket is touched.
--
-- Stored value: level, timestamp_ms and period_ms as three little-endian 64-bit integers
-- (24 bytes; struct.pack/unpack cost less Redis CPU than formatting and matching text). The
-- timestamp never moves backwards, so a call carrying an older clock reading cannot refill a
-- bucket twice. A bucket whose period changed since it was written is rescaled to the new unit.
--
-- Decision: allowed only if every enforced (or gate) bucket holds its cost; then every bucket
-- that holds its cost is debited (shadow buckets included, gates never), or, when denied, none
-- is. Keys get a TTL equal to the time they need to refill completely: an expired key reads as a
-- full bucket, which is exactly what it would hold.
--
-- Returns {allowed, config_version, now_ms, level_1, status_1, ..., level_n, status_n} where
-- level is the bucket's units after the call and status is 1 = debited, 0 = held the cost but
-- not debited, -1 = short of the cost (a denial, or a would-be denial for a shadow bucket).

local n = (#ARGV - 2) / 5
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local debit = ARGV[2] == '1'

local stored = redis.call('MGET', unpack(KEYS))
local levels, stamps, short = {}, {}, {}
local allowed = 1

for i = 1, n do
  local a = 3 + (i - 1) * 5
  local period, capacity, refill = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local cost, enforce = tonumber(ARGV[a + 3]), ARGV[a + 4] ~= '0'
  local level, stamp = capacity, now
  local value = stored[i]
  if value and #value == 24 then  -- anything else is not ours: treat the bucket as full
    local p
    level, stamp, p = struct.unpack('<i8i8i8', value)
    if p ~= period then level = math.floor(level * period / p) end
    if now > stamp then
      local gap = now - stamp
      if gap >= (capacity - level) / refill then level = capacity else level = level + gap * refill end
      stamp = now
    end
    if level > capacity then level = capacity end
  end
  levels[i], stamps[i] = level, stamp
  short[i] = level < cost
  if short[i] and enforce then allowed = 0 end
end

local result = {allowed, stored[n + 1] or '0', now}
for i = 1, n do
  local a = 3 + (i - 1) * 5
  local status = 0
  if short[i] then
    status = -1
  elseif allowed == 1 and debit and ARGV[a + 4] ~= '2' then
    local period, capacity, refill = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    local level = levels[i] - tonumber(ARGV[a + 3])
    -- full again at stamp + (capacity - level) / refill; the stamp may be ahead of now
    local ttl = math.ceil((capacity - level) / refill) + stamps[i] - now
    if ttl < 1 then ttl = 1 end
    redis.call('SET', KEYS[i], struct.pack('<i8i8i8', level, stamps[i], period), 'PX', ttl)
    levels[i] = level
    status = 1
  end
  result[#result + 1] = levels[i]
  result[#result + 1] = status
end
return result
