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
--             debited; a request is refused while a gate bucket holds less than its cost).
--             A calendar quota (mode 3 = enforce, 4 = shadow; buckets.CalendarQuota) sends
--             seven: rule id, period start_ms, limit N, next start_ms, cost, mode, the start
--             after next (ms); its units are plain units (one per token). A concurrency
--             limit (mode 5 = enforce, 6 = shadow; buckets.ConcurrencySlot) sends six: rule id,
--             timeout_ms, N, the request's slot id, 1, mode; its key is its own sorted set (in
--             the identity's {tag}), and its units are slots (the level is the slots free)
--
-- Units: one token is period_ms units, so a rule of `rate` tokens per `period_ms` refills exactly
-- `rate` units per millisecond. Every quantity is an integer (below 2^53, exact in a Lua
-- double): nothing is rounded, so nothing drifts however often the bucket is touched. (A refill
-- level + gap * refill may exceed 2^53 after a long idle time; it is then far above capacity,
-- and the clamp to capacity makes it exact again.)
--
-- Stored value of a key: the key's expiry (int64 ms, on this script's clock), then one 28-byte
-- record per bucket: rule id (int32), level, timestamp_ms, period_ms (int64), little-endian.
-- A key holding one bucket (the common case) is 36 bytes and read with one unpack, no search.
-- The timestamp never moves backwards, so a call carrying an older clock reading cannot refill a
-- bucket twice. A bucket whose period changed since it was written is rescaled to the new unit.
-- A value that is not ours reads as full buckets and is replaced on the next debit.
--
-- Calendar quotas: their record is rule id, used, the period's start_ms, CALENDAR (-1) in place
-- of period_ms: the units used, never the units left, so an edit of N keeps the usage. The
-- boundaries come from the caller, the choice from this script's clock: now >= next start
-- means the next period (counted from 0), so app servers whose clocks differ agree; a record
-- of another period (or a token-bucket record) counts as 0 used. The level reported is
-- N - used (never below 0), plus NEXT_PERIOD when it is the next period's (the caller then
-- knows which boundary comes next). Its key lives until the period's end + SLACK_MS. A
-- token bucket reading a calendar record (the rule's kind was changed) starts full.
--
-- Concurrency limits: a sorted set of the requests in flight, member = slot id (8 bytes), score
-- = its deadline (now + timeout). Members past their deadline are removed first (a crashed
-- worker's slot lives no longer than the timeout), then the request holds its cost when fewer
-- than N remain; the slot is added only when the whole decision is allowed and debited (the
-- same all-or-nothing as the buckets). It is released by a ZREM of its member (idempotent), or
-- by refund.lua on a Cluster. Only calls with such a limit pay its ZREMRANGEBYSCORE, ZCARD,
-- ZADD and PEXPIRE.
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
-- Cost (Redis CPU, measured with INFO commandstats; in this Lua every operation counts): one
-- TIME, one MGET, one SET per key written; one struct.unpack per argument and per stored
-- record, one struct.pack per key written; no table per bucket; a key holding one bucket is
-- read and written whole (no search, no string.sub), one debited in this call needs no TTL
-- division unless re-armed; the common reply carries levels only.
--
-- Returns, when the call debited every bucket (allowed, ARGV[2] = "1", no bucket short of its
-- cost, no gate): {2, config_version, level_1, ..., level_n} (each status is 1). Otherwise
-- {allowed, config_version, level_1, status_1, ..., level_n, status_n} with allowed 1 or 0,
-- where level is the bucket's units after the call and status is 1 = debited, 0 = held the
-- cost but not debited, -1 = short of the cost (a denial, or a would-be denial for a shadow
-- bucket). stores/redis.parse_take_reply reads both.

local SLACK_MS = 1000
local CALENDAR, NEXT_PERIOD = -1, 4503599627370496  -- 2^52: above any level (2^50)
local unpack_, pack, floor, ceil, find = struct.unpack, struct.pack, math.floor, math.ceil, string.find
local keys, argv, call = KEYS, ARGV, redis.call
local n = #argv - 2
local now = tonumber(argv[1])
if not now then
  local t = call('TIME')
  now = t[1] * 1000 + floor(t[2] / 1000)
end
local stored = call('MGET', unpack(keys))

-- buckets whose key another bucket of this call shares (several rules of one identity): they
-- take the multi-record path (interned strings: the compares are pointer compares)
local shared
for i = 1, n - 1 do
  local key = keys[i]
  for j = i + 1, n do
    if keys[j] == key then
      shared = shared or {}
      shared[i], shared[j] = true, true
    end
  end
end

local result = {2, stored[n + 1] or '0'}  -- result[i + 2]: bucket i's level, debited if it may be
local debit = argv[2] == '1'
local allowed, every_debited = true, debit
-- writes[2i - 1]: bucket i's new value (a key of its own) or record (in place), true
-- (multi-record path) or false (not debitable: short, or a gate); writes[2i]: the PX to re-arm
-- its key with (> 0), minus the record's offset for SETRANGE (< 0), or false (KEEPTTL)
local writes = {}
local records  -- multi-record path: i -> {rule, level, stamp, period, full_at}
local next_period  -- calendar quotas counted in the next period: i -> true
local slots  -- concurrency limits taking a slot: i -> the slot's deadline (ms)
for i = 1, n do
  local rule, period, capacity, refill, cost, mode = unpack_('<i8i8i8i8i8i8', argv[i + 2])
  local level, stamp, expiry, alone, offset = capacity, now, 0, true, nil
  if mode > 4 then
    -- a concurrency limit (its own sorted-set key, which MGET read as nil): period = the
    -- timeout, capacity = N, refill = the slot id; slots past their deadline are dropped first
    local key = keys[i]
    call('ZREMRANGEBYSCORE', key, '-inf', now)
    level = capacity - call('ZCARD', key)
    if level < 1 then
      if level < 0 then level = 0 end  -- N was lowered below the slots taken
      every_debited = false
      if mode == 5 then allowed = false end
      result[i + 2], writes[2 * i - 1] = level, false
    else
      result[i + 2] = level - 1
      slots = slots or {}
      slots[i] = now + period
      writes[2 * i - 1] = 1
    end
  elseif mode > 2 then
    -- a calendar quota: period = the period's start, capacity = N, refill = the next start
    local start, ends, used = period, refill, 0
    if now >= refill then
      start, ends = refill, unpack_('<i8', argv[i + 2], 49)
      next_period = next_period or {}
      next_period[i] = true
    end
    local value = stored[i]
    if value then
      local size = #value
      if size == 36 then
        local e, id, u, s, p = unpack_('<i8i4i8i8i8', value)
        expiry = e
        if id == rule then
          if p == CALENDAR and s == start then used = u end
        else
          alone = false
        end
      elseif size > 36 and (size - 8) % 28 == 0 then
        alone, expiry = false, unpack_('<i8', value)
        for a = 9, size, 28 do
          local id, u, s, p = unpack_('<i4i8i8i8', value, a)
          if id == rule then
            offset = a + 3
            if p == CALENDAR and s == start then used = u end
            break
          end
        end
      end
    end
    level = capacity - used
    if level < 0 then level = 0 end  -- N was lowered below what this period used
    if level < cost then
      every_debited = false
      if mode == 3 then allowed = false end
      result[i + 2], writes[2 * i - 1] = level, false
    else
      level, used = level - cost, used + cost
      result[i + 2] = level
      if alone and not (shared and shared[i]) then
        local px = false
        if ends > expiry then expiry = ends + SLACK_MS; px = expiry - now end
        writes[2 * i - 1] = pack('<i8i4i8i8i8', expiry, rule, used, start, CALENDAR)
        writes[2 * i] = px
      elseif offset and not (shared and shared[i]) and ends <= expiry then
        writes[2 * i - 1] = pack('<i8i8i8', used, start, CALENDAR)
        writes[2 * i] = -offset
      else
        records = records or {}
        records[i] = {rule, used, start, CALENDAR, ends}
        writes[2 * i - 1] = true
      end
    end
  else
    local value = stored[i]
    if value then
      local size, found = #value, false
      if size == 36 then
        local e, id, l, s, p = unpack_('<i8i4i8i8i8', value)
        if id == rule then
          found, level, stamp, expiry = true, l, s, e
          if p ~= period then level = p > 0 and floor(level * period / p) or capacity end
        else
          alone = false  -- the key holds another rule's bucket: keep it
        end
      elseif size > 36 and (size - 8) % 28 == 0 then
        alone = false
        -- the record starting with the rule id (a plain find, then skip a match that is not at
        -- a record's start)
        local needle = pack('<i4', rule)
        local at = find(value, needle, 9, true)
        while at and (at - 9) % 28 ~= 0 do at = find(value, needle, at + 1, true) end
        if at then
          local l, s, p = unpack_('<i8i8i8', value, at + 4)
          found, level, stamp, expiry, offset = true, l, s, unpack_('<i8', value), at + 3
          if p ~= period then level = p > 0 and floor(level * period / p) or capacity end
        end
      end
      if found and now > stamp then
        level, stamp = level + (now - stamp) * refill, now
      end
      if level > capacity then level = capacity end
    end
    if level < cost then
      every_debited = false
      if mode ~= 0 then allowed = false end
      result[i + 2], writes[2 * i - 1] = level, false
    elseif mode == 2 then
      every_debited = false
      result[i + 2], writes[2 * i - 1] = level, false
    else
      level = level - cost
      result[i + 2] = level
      if alone and not (shared and shared[i]) then
        -- full again at stamp + ceil((capacity - level) / refill) (the stamp may be ahead of
        -- now): later than the expiry the key holds exactly when this holds
        if capacity - level > (expiry - stamp) * refill then
          expiry = stamp + ceil((capacity - level) / refill) + SLACK_MS
          writes[2 * i - 1] = pack('<i8i4i8i8i8', expiry, rule, level, stamp, period)
          writes[2 * i] = expiry > now and expiry - now or 1
        else
          writes[2 * i - 1] = pack('<i8i4i8i8i8', expiry, rule, level, stamp, period)
          writes[2 * i] = false
        end
      elseif offset and not (shared and shared[i]) and
          capacity - level <= (expiry - stamp) * refill then
        -- its record in a key of several buckets, and the key lives long enough: overwrite the
        -- record's level, stamp and period in place (SETRANGE keeps the TTL)
        writes[2 * i - 1] = pack('<i8i8i8', level, stamp, period)
        writes[2 * i] = -offset
      else
        records = records or {}
        records[i] = {rule, level, stamp, period, stamp + ceil((capacity - level) / refill)}
        writes[2 * i - 1] = true
      end
    end
  end
end

if allowed and debit then
  local values, need, order  -- multi-record keys: new value, latest full_at, write order
  for i = 1, n do
    local value = writes[2 * i - 1]
    if value == true then
      local record, key = records[i], keys[i]
      local rule = record[1]
      values, need, order = values or {}, need or {}, order or {}
      local current = values[key]
      if not current then
        current = stored[i]
        local size = current and #current or 0
        if size < 36 or (size - 8) % 28 ~= 0 then current = '\0\0\0\0\0\0\0\0' end
        order[#order + 1], need[key] = key, 0
      end
      local packed = pack('<i4i8i8i8', rule, record[2], record[3], record[4])
      local at
      for a = 9, #current, 28 do
        if unpack_('<i4', current, a) == rule then at = a; break end
      end
      if at then
        current = string.sub(current, 1, at - 1) .. packed .. string.sub(current, at + 28)
      else
        current = current .. packed
      end
      values[key] = current
      if record[5] > need[key] then need[key] = record[5] end
    elseif slots and slots[i] then
      -- the slot: member = the slot id's 8 bytes, score = its deadline; the set lives until
      -- its latest deadline (+ SLACK_MS)
      local deadline = slots[i]
      call('ZADD', keys[i], deadline, string.sub(argv[i + 2], 25, 32))
      call('PEXPIRE', keys[i], deadline - now + SLACK_MS)
    elseif value then
      local px = writes[2 * i]  -- > 0: re-arm with PX; < 0: -offset of a record; false
      if not px then
        call('SET', keys[i], value, 'KEEPTTL')
      elseif px > 0 then
        call('SET', keys[i], value, 'PX', px)
      else
        call('SETRANGE', keys[i], -px, value)
      end
    end
  end
  if order then
    for j = 1, #order do
      local key = order[j]
      local value = values[key]
      if need[key] > unpack_('<i8', value) then
        local expiry = need[key] + SLACK_MS
        call('SET', key, pack('<i8', expiry) .. string.sub(value, 9), 'PX',
             math.max(1, expiry - now))
      else
        call('SET', key, value, 'KEEPTTL')
      end
    end
  end
  if every_debited then
    if next_period then
      for i in pairs(next_period) do result[i + 2] = result[i + 2] + NEXT_PERIOD end
    end
    return result
  end
end

-- the full reply: levels before any debit that did not happen, and each bucket's status
local reply = {allowed and 1 or 0, result[2]}
for i = 1, n do
  local level, status = result[i + 2], 0
  if writes[2 * i - 1] then  -- held its cost: debited, or its level was shown as if debited
    if allowed and debit then
      status = 1
    else
      local _, _, _, _, cost = unpack_('<i8i8i8i8i8', argv[i + 2])
      level = level + cost
    end
  else
    local _, _, _, _, cost = unpack_('<i8i8i8i8i8', argv[i + 2])
    if level < cost then status = -1 end
  end
  reply[2 * i + 1], reply[2 * i + 2] = level, status
end
if next_period then
  for i in pairs(next_period) do reply[2 * i + 1] = reply[2 * i + 1] + NEXT_PERIOD end
end
return reply
