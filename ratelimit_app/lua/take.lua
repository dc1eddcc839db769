-- All-or-nothing debit of several token buckets in one atomic call.
--
-- KEYS[1..n]  each bucket's key: one key per identity (scope value), holding every bucket of
--             that identity, so buckets of one identity repeat the same key; KEYS[n+1], if
--             given, the config version counter (read, never written here; on a Redis Cluster
--             only a call in its slot can read it)
-- ARGV[1]     now in milliseconds, or "" to use the Redis server clock (tests pass a value)
-- ARGV[2]     "1" to debit, "0" to only look (simulator, inspector)
-- ARGV[3..]   one per bucket: six little-endian int64 (buckets.Bucket.spec, built once per rule
--             snapshot): rule id, period_ms, capacity, refill_per_ms, cost, mode
--             (mode 1 = enforce, 0 = shadow, 2 = gate: enforced, but only checked, never
--             debited; a request is refused while a gate bucket holds less than its cost)
--
-- Units: one token is period_ms units, so a rule of `rate` tokens per `period_ms` refills exactly
-- `rate` units per millisecond. Every quantity is an integer (below 2^53, exact in a Lua
-- double): nothing is rounded, so nothing drifts however often the bucket is touched.
--
-- Stored value of a key: the key's expiry (int64 ms, on this script's clock), then one 28-byte
-- record per bucket: rule id (int32), level, timestamp_ms, period_ms (int64), little-endian.
-- The timestamp never moves backwards, so a call carrying an older clock reading cannot refill a
-- bucket twice. A bucket whose period changed since it was written is rescaled to the new unit.
-- A value that is not ours reads as full buckets and is replaced on the next debit.
--
-- TTL: a key lives until its slowest bucket is full again (an expired key reads as full buckets,
-- which is exactly what they would hold). Setting a TTL costs Redis more than the write itself,
-- so a key is re-armed (PX) only when a debit needs it to live longer than the expiry it holds,
-- and then with SLACK_MS to spare; otherwise it is written with KEEPTTL. A key never expires
-- before its buckets are full, and at most SLACK_MS after.
--
-- Decision: allowed only if every enforced (or gate) bucket holds its cost; then every bucket
-- that holds its cost is debited (shadow buckets included, gates never), or, when denied, none
-- is.
--
-- Cost (Redis CPU): one TIME, one MGET, one SET per key written, struct (un)packing instead of
-- text, and a key that holds this bucket alone (the common case) written with one pack.
--
-- Returns {allowed, config_version, level_1, status_1, ..., level_n, status_n} where level is the
-- bucket's units after the call and status is 1 = debited, 0 = held the cost but not debited,
-- -1 = short of the cost (a denial, or a would-be denial for a shadow bucket).

local SLACK_MS = 1000
local SPEC, RECORD_FORMAT, VALUE_FORMAT = '<i8i8i8i8i8i8', '<i4i8i8i8', '<i8i4i8i8i8'
local HEADER, RECORD = 8, 28
local EMPTY = struct.pack('<i8', 0)
local unpack_, pack, sub = struct.unpack, struct.pack, string.sub

local n = #ARGV - 2
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local debit = ARGV[2] == '1'
local stored = redis.call('MGET', unpack(KEYS))

local function find(value, rule)
  for at = HEADER + 1, #value, RECORD do
    if unpack_('<i4', value, at) == rule then return at end
  end
  return nil
end

local function ours(value)
  return value and #value >= HEADER + RECORD and (#value - HEADER) % RECORD == 0
end

-- whether bucket i is the only one of its key in this call (interned strings: cheap compares)
local function alone(i)
  local key = KEYS[i]
  for j = 1, n do
    if j ~= i and KEYS[j] == key then return false end
  end
  return true
end

local levels, stamps = {}, {}
local allowed = 1
for i = 1, n do
  local rule, period, capacity, refill, cost, mode = unpack_(SPEC, ARGV[i + 2])
  local level, stamp = capacity, now
  local value = stored[i]
  local at = ours(value) and find(value, rule)
  if at then
    local p
    level, stamp, p = unpack_('<i8i8i8', value, at + 4)
    if p ~= period then level = math.floor(level * period / p) end
    if now > stamp then
      local gap = now - stamp
      if gap >= (capacity - level) / refill then level = capacity else level = level + gap * refill end
      stamp = now
    end
    if level > capacity then level = capacity end
  end
  levels[i], stamps[i] = level, stamp
  if level < cost and mode ~= 0 then allowed = 0 end
end

local result = {allowed, stored[n + 1] or '0'}
if allowed == 1 and debit then
  local values, need, expiries, written = {}, {}, {}, {}
  for i = 1, n do
    local rule, period, capacity, refill, cost, mode = unpack_(SPEC, ARGV[i + 2])
    local level, status = levels[i], 0
    if level < cost then
      status = -1
    elseif mode ~= 2 then
      level, status = level - cost, 1
      local key, value = KEYS[i], stored[i]
      local stamp = stamps[i]
      -- full again at stamp + (capacity - level) / refill; the stamp may be ahead of now
      local full = stamp + math.ceil((capacity - level) / refill)
      if not ours(value) then value = nil end
      if alone(i) and (not value or (#value == HEADER + RECORD and find(value, rule))) then
        -- the common case: the key holds this bucket alone, one pack writes it
        local expiry = value and unpack_('<i8', value) or 0
        if full > expiry then
          expiry = full + SLACK_MS
          redis.call('SET', key, pack(VALUE_FORMAT, expiry, rule, level, stamp, period), 'PX', math.max(1, expiry - now))
        else
          redis.call('SET', key, pack(VALUE_FORMAT, expiry, rule, level, stamp, period), 'KEEPTTL')
        end
      else
        value = values[key]
        if not value then
          value = ours(stored[i]) and stored[i] or EMPTY
          written[#written + 1], need[key] = key, 0
        end
        local record = pack(RECORD_FORMAT, rule, level, stamp, period)
        local at = find(value, rule)
        if at then value = sub(value, 1, at - 1) .. record .. sub(value, at + RECORD)
        else value = value .. record end
        values[key] = value
        if full > need[key] then need[key] = full end
      end
    end
    result[2 * i + 1], result[2 * i + 2] = level, status
  end
  for j = 1, #written do  -- keys holding several buckets
    local key = written[j]
    local value = values[key]
    if need[key] > unpack_('<i8', value) then
      local expiry = need[key] + SLACK_MS
      redis.call('SET', key, pack('<i8', expiry) .. sub(value, HEADER + 1), 'PX', math.max(1, expiry - now))
    else
      redis.call('SET', key, value, 'KEEPTTL')
    end
  end
else
  for i = 1, n do
    local _, _, _, _, cost = unpack_(SPEC, ARGV[i + 2])
    result[2 * i + 1], result[2 * i + 2] = levels[i], levels[i] < cost and -1 or 0
  end
end
return result
