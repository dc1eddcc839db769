-- All-or-nothing debit of several token buckets in one atomic call.
--
-- KEYS[1..n]  each bucket's key: one key per identity (scope value), holding every bucket of
--             that identity, so buckets of one identity repeat the same key; KEYS[n+1], if
--             given, the config version counter (read, never written here; on a Redis Cluster
--             only a call in its slot can read it)
-- ARGV[1]     now in milliseconds, or "" to use the Redis server clock (tests pass a value)
-- ARGV[2]     "1" to debit, "0" to only look (simulator, inspector); a debit may be fenced:
--             "1" followed by the config version the caller's rules were compiled from, and
--             when the version key holds another (a missing key reads "0"), the call debits
--             nothing and replies {3, the stored version}: the caller decides again on fresh
--             rules (see config/policy.py, "Freshness")
-- ARGV[3..]   one per bucket: six little-endian int64 (buckets.Bucket.spec, built once per rule
--             snapshot): rule id, period_ms, capacity, refill_per_ms, cost, mode
--             (mode 1 = enforce, 0 = shadow, 2 = gate: enforced, but only checked, never
--             debited; a request is refused while a gate bucket holds less than its cost).
--             A calendar quota (mode 3 = enforce, 4 = shadow; buckets.CalendarQuota) sends
--             seven: rule id, period start_ms, limit N, next start_ms, cost, mode, the start
--             after next (ms); its units are plain units (one per token). A concurrency
--             limit (mode 5 = enforce, 6 = shadow; buckets.ConcurrencySlot) sends six: rule id,
--             timeout_ms, N, the request's slot id, 1, mode; its key is its own sorted set (in
--             the identity's {tag}), and its units are slots (the level is the slots free).
--             A credit balance (mode 7 = enforce, 8 = shadow; buckets.CreditBalance) sends a
--             calendar quota's seven (its allowance as N; a never-refilled balance's period
--             starts at 0 and never ends); its key is its own (in the identity's {tag})
--             A checked bucket (mode -1; buckets.CheckedBucket) is a token bucket that
--             refuses while it holds less than its cost, like a gate, but never debited and,
--             while it holds its cost, neither short nor debited: the common reply stays the
--             short one. A credential's proof (below) does not let it pass.
--             A ban's check (buckets.BanGate, protection/bans.py) sends only its gate
--             record's id (one little-endian int32): a checked bucket of capacity and cost
--             GATE units refilling 1 unit per ms, which ban.lua writes. The common case (no
--             ban record in the key) costs a plain find, no unpack and no arithmetic.
--             Folded ban checks (stores/ban_checks.py): a token bucket's six int64 may be
--             followed by ban checks it carries, 8 bytes each: the gate record's id (int32)
--             and the index in KEYS of the key holding it (int32): one of the buckets' keys,
--             or a key of its own after the version counter's (KEYS[n+2..], read only).
--             A folded check has no argument, key or reply entry of its own (each costs Redis
--             about 0.4 µs); the full reply appends its level and status after the buckets'.
--             A credential's proof from a client address (mode 9; buckets.CredentialProof)
--             sends six: 0, memory_ms, 0, 0, 0, 9; its key is its own string (in the
--             address's {tag}) holding the last time the credential was used from there
--             (ms). It comes just before the address's failed-auth gates: while it holds a
--             time, those gates let the request through even when empty (a credential proven
--             from the address is not punished for others' failures there). An allowed debit
--             writes it again when older than half its memory. Its level is 1 if proven, else 0.
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
-- and then with SLACK_MS to spare; otherwise it keeps its TTL (SETRANGE, or SET with KEEPTTL).
-- A key never expires before its buckets are full, and at most SLACK_MS after.
--
-- Credit balances: the value is granted, spent, used, the period's start, seq (five int64,
-- decision/balances.py), never expiring. Units left = max(0, N - used) + granted - spent, where
-- used counts the period's consumption (a record of another period: 0): the allowance is spent
-- first, and spent grows by what goes past it. A debit overwrites spent, used, the start and
-- seq (+ 1) in place (SETRANGE, like a bucket's record: cheaper for Redis than a SET). A
-- missing value is not guessed: the call debits nothing and replies {4, config_version, i, ...}
-- (the balances missing): the caller seeds them from the ledger and decides again.
--
-- Decision: allowed only if every enforced (or gate) bucket holds its cost; then every bucket
-- that holds its cost is debited (shadow buckets included, gates never), or, when denied, none
-- is.
--
-- Cost (Redis CPU, measured with INFO commandstats; in this Lua every operation counts): one
-- TIME, one MGET, one write per bucket debited: a bucket whose record is found in a key that
-- lives long enough (the common case) has only the fields that changed overwritten in place
-- (SETRANGE at an offset given as a string: cheaper for Redis than a SET, which also returns
-- a table, or than a number argument, which Redis formats with printf); otherwise its key is
-- written whole (SET). One struct.unpack per argument and per stored record, one struct.pack
-- per write, with fewer fields when fewer changed (the level alone while the stamp has not
-- moved: several calls in one ms); a key holding one bucket is read with one unpack (no
-- search); one table in all (the reply), none per bucket; no TTL division unless re-armed;
-- the common reply carries levels only.
--
-- Returns, when the call debited every bucket (allowed, ARGV[2] = "1", no bucket short of its
-- cost, no gate): {2, config_version, level_1, ..., level_n} (each status is 1). Otherwise
-- {allowed, config_version, level_1, status_1, ..., level_n, status_n} with allowed 1 or 0,
-- where level is the bucket's units after the call and status is 1 = debited, 0 = held the
-- cost but not debited, -1 = short of the cost (a denial, or a would-be denial for a shadow
-- bucket), then a level and a status for each folded ban check, in the order sent (the
-- common reply has none: no ban was in force). A fenced call replies {3, config_version} (see
-- ARGV[2]); a call that found a credit balance missing {4, config_version, i, ...}.
-- stores/redis.parse_take_reply reads all three.

local SLACK_MS = 1000
local GATE = 1000  -- a ban's gate: capacity and cost (units), refilling 1 unit per ms
local CALENDAR, NEXT_PERIOD = -1, 4503599627370496  -- 2^52: above any level (2^50)
local unpack_, pack, floor, ceil, find, sub, byte =
  struct.unpack, struct.pack, math.floor, math.ceil, string.find, string.sub, string.byte
local keys, argv, call = KEYS, ARGV, redis.call
local n = #argv - 2
local now = argv[1]
now = now ~= '' and tonumber(now)
if not now then
  local t = call('TIME')
  local us = t[2] + 0
  now = t[1] * 1000 + (us - us % 1000) / 1000
end
local stored = call('MGET', unpack(keys))
local flag = argv[2]
if #flag > 1 and sub(flag, 2) ~= (stored[n + 1] or '0') then
  return {3, stored[n + 1] or '0'}  -- fenced: the rules sent were superseded
end

-- result[i + 2]: bucket i's level; after the levels, result[n + 3 .. m]: the in-place writes,
-- three entries each (key, offset of the fields, the fields: SETRANGE), cut off before the
-- reply (one table, with room for 4 buckets: growing a table costs more than its nils)
local result = {2, stored[n + 1] or '0', nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
                nil, nil, nil, nil, nil}
local m = n + 2
local debit = byte(flag, 1) == 49  -- "1", with or without a fence
local allowed, every_debited = true, debit
-- A bucket that holds its cost is debited if the decision allows, by one of: an in-place write
-- (queued in result), its key of its own written whole (whole), its record in a key written
-- whole (records), a concurrency slot (slots)
local short  -- buckets that did not hold their cost, or gates: i -> true
local whole  -- i -> {value, the PX to re-arm the key with or false (KEEPTTL)}
local records  -- i -> {rule, level, stamp, period, full_at}
local next_period  -- calendar quotas counted in the next period: i -> true
local slots  -- concurrency limits taking a slot: i -> the slot's deadline (ms)
local missing  -- credit balances without a value: the indices
local proven  -- a credential proof (mode 9) earlier in this call holds a time
local proofs  -- credential proofs to write: i -> their memory (ms)
local folded, bans = 0  -- folded ban checks seen; bans: those in force, their index -> level
for i = 1, n do
  local spec = argv[i + 2]
  if #spec == 4 then
    -- a ban's check (buckets.BanGate): its spec is its gate record's id, searched for as
    -- is any record in a key of several; no record, or a full one, is no ban in force (the
    -- search is written out again for folded checks below: a local function would be a
    -- closure made on every call, 2.5 % of a decision's CPU)
    local level, value = GATE, stored[i]
    if value and #value % 28 == 8 then  -- (a value not ours holds no ban)
      local a = find(value, spec, 9, true)
      while a and (a - 9) % 28 ~= 0 do a = find(value, spec, a + 1, true) end
      if a then
        local banned, stamp = unpack_('<i8i8', value, a + 4)
        if now > stamp then banned = banned + now - stamp end
        if banned < GATE then
          level, allowed, every_debited = banned, false, false
          short = short or {}
          short[i] = true
        end
      end
    end
    result[i + 2] = level
  else
    local rule, period, capacity, refill, cost, mode = unpack_('<i8i8i8i8i8i8', spec)
    -- once its record is found: at = the offset of the fields after its id (for SETRANGE),
    -- same = its period_ms (CALENDAR for a calendar record)
    local level, stamp, expiry, alone, at, same, moved = capacity, now, 0, true
    if mode == 9 then
      -- a credential's proof from this address (period = its memory): see the header
      -- (a test clock is not Redis's: the age is checked as well as the key's TTL)
      local used_at = tonumber(stored[i])
      proven = used_at ~= nil and now - used_at <= period
      result[i + 2] = proven and 1 or 0
      if not used_at or now - used_at > period / 2 then
        proofs = proofs or {}
        proofs[i] = period
      end
    elseif mode > 6 then
      -- a credit balance: period = the allowance's period start, capacity = N, refill = the next
      -- start
      local value = stored[i]
      if not value or #value ~= 40 then
        missing = missing or {}
        missing[#missing + 1] = i
      else
        local granted, spent, used, start, seq = unpack_('<i8i8i8i8i8', value)
        local current = now >= refill and refill or period
        if start ~= current then start, used = current, 0 end
        local free = capacity - used
        if free < 0 then free = 0 end
        level = free + granted - spent
        if level < cost then
          every_debited = false
          if mode == 7 then allowed = false end
          result[i + 2] = level
          short = short or {}
          short[i] = true
        else
          -- past the allowance, the rest of the cost is prepaid units
          local over, after = used - capacity, used + cost - capacity
          if over < 0 then over = 0 end
          if after < 0 then after = 0 end
          result[i + 2] = level - cost
          -- written in place like a bucket's record: the four fields after granted (which only
          -- a top-up raises)
          result[m + 1], result[m + 2] = keys[i], '8'
          result[m + 3] = pack('<i8i8i8i8', spent + after - over, used + cost, start, seq + 1)
          m = m + 3
        end
      end
    elseif mode > 4 then
      -- a concurrency limit (its own sorted-set key, which MGET read as nil): period = the
      -- timeout, capacity = N, refill = the slot id; slots past their deadline are dropped first
      local key = keys[i]
      call('ZREMRANGEBYSCORE', key, '-inf', now)
      level = capacity - call('ZCARD', key)
      if level < 1 then
        if level < 0 then level = 0 end  -- N was lowered below the slots taken
        every_debited = false
        if mode == 5 then allowed = false end
        result[i + 2] = level
        short = short or {}
        short[i] = true
      else
        result[i + 2] = level - 1
        slots = slots or {}
        slots[i] = now + period
      end
    else
      local value = stored[i]
      if value then
        -- the bucket's record: a key of one record is read with one unpack; in a key of
        -- several, a plain find of the id's 4 bytes (the low ones of the spec's first int64),
        -- skipping a match that is not at a record's start
        local size = #value
        if size == 36 then
          local e, id, l, s, p = unpack_('<i8i4i8i8i8', value)
          expiry = e
          if id == rule then
            at, level, stamp, same = '12', l, s, p
          else
            alone = false  -- the key holds another rule's bucket: keep it
          end
        elseif size > 36 and (size - 8) % 28 == 0 then
          alone = false
          local needle = sub(argv[i + 2], 1, 4)
          local a = find(value, needle, 9, true)
          while a and (a - 9) % 28 ~= 0 do a = find(value, needle, a + 1, true) end
          if a then
            level, stamp, same = unpack_('<i8i8i8', value, a + 4)
            expiry = unpack_('<i8', value)
            -- the offset as a string constant for the first records (see Cost)
            if a == 9 then at = '12' elseif a == 37 then at = '40' elseif a == 65 then at = '68'
            elseif a == 93 then at = '96' elseif a == 121 then at = '124'
            elseif a == 149 then at = '152' elseif a == 177 then at = '180' else at = a + 3 end
          end
        end
      end
      if #spec > 48 and mode < 3 then
        -- the ban checks this token bucket carries (see ARGV): gate record id, key index; the
        -- bucket's own key holding no record but its own (alone) holds no ban
        for at = 49, #spec, 8 do
          folded = folded + 1
          local index = unpack_('<i4', spec, at + 4)
          local held = stored[index]
          if held and not (index == i and alone) and #held % 28 == 8 then
            local id = sub(spec, at, at + 3)
            local a = find(held, id, 9, true)
            while a and (a - 9) % 28 ~= 0 do a = find(held, id, a + 1, true) end
            if a then
              local banned, stamp = unpack_('<i8i8', held, a + 4)
              if now > stamp then banned = banned + now - stamp end
              if banned < GATE then
                allowed, every_debited = false, false
                bans = bans or {}
                bans[folded] = banned
              end
            end
          end
        end
      end
      if mode > 2 then
        -- a calendar quota: period = the period's start, capacity = N, refill = the next start;
        -- its record: used, start (in level, stamp), CALENDAR (in same)
        local start, ends, used = period, refill, 0
        if now >= refill then
          start, ends = refill, unpack_('<i8', argv[i + 2], 49)
          next_period = next_period or {}
          next_period[i] = true
        end
        if at and same == CALENDAR and stamp == start then used = level end
        same = same == CALENDAR and stamp == start
        level = capacity - used
        if level < 0 then level = 0 end  -- N was lowered below what this period used
        if level < cost then
          every_debited = false
          if mode == 3 then allowed = false end
          result[i + 2] = level
          short = short or {}
          short[i] = true
        else
          level, used = level - cost, used + cost
          result[i + 2] = level
          if at and ends <= expiry then
            -- its record found, and the key lives long enough: overwrite it in place
            result[m + 1], result[m + 2] = keys[i], at
            result[m + 3] = same and pack('<i8', used) or pack('<i8i8i8', used, start, CALENDAR)
            m = m + 3
          else
            if alone then  -- unless another bucket of this call shares the key
              local key = keys[i]
              for j = 1, n do
                if keys[j] == key and j ~= i then alone = false; break end
              end
            end
            if alone then
              local px = false
              if ends > expiry then expiry = ends + SLACK_MS; px = expiry - now end
              whole = whole or {}
              whole[i] = {pack('<i8i4i8i8i8', expiry, rule, used, start, CALENDAR), px}
            else
              records = records or {}
              records[i] = {rule, used, start, CALENDAR, ends}
            end
          end
        end
      else
        if at then
          if same ~= period then  -- the period changed: rescale to the new unit
            level = same > 0 and floor(level * period / same) or capacity
          end
          if now > stamp then level, stamp, moved = level + (now - stamp) * refill, now, true end
          if level > capacity then level = capacity end
        end
        if level < cost and not (proven and mode == 2) then
          every_debited = false
          if mode ~= 0 then allowed = false end
          result[i + 2] = level
          short = short or {}
          short[i] = true
        elseif mode == 2 then
          every_debited = false
          -- a gate a proven credential passes is shown holding the cost (it is not its limit)
          result[i + 2] = level < cost and cost or level
          short = short or {}
          short[i] = true
        elseif mode < 0 then
          result[i + 2] = level  -- no ban in force: checked, nothing to write
        else
          level = level - cost
          result[i + 2] = level
          -- full again at stamp + ceil((capacity - level) / refill) (the stamp may be ahead of
          -- now): later than the expiry the key holds exactly when this holds
          local rearm = capacity - level > (expiry - stamp) * refill
          if at and not rearm then
            -- its record found, and the key lives long enough: overwrite in place the record's
            -- level, and its stamp if it moved (several calls per ms do not move it), and its
            -- period if it changed
            result[m + 1], result[m + 2] = keys[i], at
            result[m + 3] = same ~= period and pack('<i8i8i8', level, stamp, period) or
                             moved and pack('<i8i8', level, stamp) or pack('<i8', level)
            m = m + 3
          else
            if alone then  -- unless another bucket of this call shares the key
              local key = keys[i]
              for j = 1, n do
                if keys[j] == key and j ~= i then alone = false; break end
              end
            end
            if alone then
              -- a key of its own (absent, not ours, or its record to re-arm)
              local px = false
              if rearm then
                expiry = stamp + ceil((capacity - level) / refill) + SLACK_MS
                px = expiry > now and expiry - now or 1
              end
              whole = whole or {}
              whole[i] = {pack('<i8i4i8i8i8', expiry, rule, level, stamp, period), px}
            else
              records = records or {}
              records[i] = {rule, level, stamp, period, stamp + ceil((capacity - level) / refill)}
            end
          end
        end
      end
      if at and records and records[i] then
        -- its record in the key written whole: drop an in-place write of the same record that
        -- an earlier bucket queued (one rule twice in a call: the later bucket's record wins)
        local key, j = keys[i], n + 5
        while j <= m do
          if result[j - 2] == key and result[j - 1] == at then
            result[j - 2], result[j - 1], result[j] = result[m - 2], result[m - 1], result[m]
            result[m - 2], result[m - 1], result[m] = nil, nil, nil
            m = m - 3
          else
            j = j + 3
          end
        end
      end
    end
  end
end

if missing then
  return {4, stored[n + 1] or '0', unpack(missing)}
end

if allowed and debit then
  if proofs then
    for i, memory in pairs(proofs) do call('SET', keys[i], now, 'PX', memory) end
  end
  if records then
    -- keys of several buckets written whole (first: an in-place write into the same key then
    -- lands on the new value): the stored value with these records replaced or appended
    local values, need, order = {}, {}, {}  -- new value, latest full_at, write order
    for i = 1, n do
      local record = records[i]
      if record then
        local key, rule = keys[i], record[1]
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
          current = sub(current, 1, at - 1) .. packed .. sub(current, at + 28)
        else
          current = current .. packed
        end
        values[key] = current
        if record[5] > need[key] then need[key] = record[5] end
      end
    end
    for j = 1, #order do
      local key = order[j]
      local value = values[key]
      if need[key] > unpack_('<i8', value) then
        local expiry = need[key] + SLACK_MS
        call('SET', key, pack('<i8', expiry) .. sub(value, 9), 'PX', math.max(1, expiry - now))
      else
        call('SET', key, value, 'KEEPTTL')
      end
    end
  end
  if whole then
    for i, write in pairs(whole) do
      if write[2] then
        call('SET', keys[i], write[1], 'PX', write[2])
      else
        call('SET', keys[i], write[1], 'KEEPTTL')
      end
    end
  end
  if slots then
    -- the slot: member = the slot id's 8 bytes, score = its deadline; the set lives until
    -- its latest deadline (+ SLACK_MS)
    for i, deadline in pairs(slots) do
      call('ZADD', keys[i], deadline, sub(argv[i + 2], 25, 32))
      call('PEXPIRE', keys[i], deadline - now + SLACK_MS)
    end
  end
  for j = n + 5, m, 3 do call('SETRANGE', result[j - 2], result[j - 1], result[j]) end
  if every_debited then
    if next_period then
      for i in pairs(next_period) do result[i + 2] = result[i + 2] + NEXT_PERIOD end
    end
    result[n + 3] = nil  -- the reply ends at the first nil
    return result
  end
end

-- the full reply: levels before any debit that did not happen, and each bucket's status
local reply = {allowed and 1 or 0, result[2]}
for i = 1, n do
  local level, status, spec = result[i + 2], 0, argv[i + 2]
  if #spec == 4 then  -- a ban's check: short while the ban is in force, never debited
    if short and short[i] then status = -1 elseif allowed and debit then status = 1 end
  elseif not (short and short[i]) then  -- held its cost: debited, or shown as if debited
    if allowed and debit then
      status = 1
    else
      local _, _, _, _, cost, mode = unpack_('<i8i8i8i8i8i8', spec)
      if mode >= 0 then level = level + cost end  -- (a checked level is never debited)
    end
  else
    local _, _, _, _, cost = unpack_('<i8i8i8i8i8', spec)
    if level < cost then status = -1 end
  end
  reply[2 * i + 1], reply[2 * i + 2] = level, status
end
for k = 1, folded do  -- the folded ban checks: short while their ban is in force
  local level = bans and bans[k]
  reply[2 * (n + k) + 1] = level or GATE
  reply[2 * (n + k) + 2] = level and -1 or (allowed and debit) and 1 or 0
end
if next_period then
  for i in pairs(next_period) do reply[2 * i + 1] = reply[2 * i + 1] + NEXT_PERIOD end
end
return reply
