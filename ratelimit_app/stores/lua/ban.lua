-- The penalty box: count a caller's events towards its bans, ban it, or lift its bans; one
-- atomic call on the caller's own key (protection/bans.py).
--
-- KEYS[1]   the caller's key: the one take.lua keeps its buckets in, so that the ban written
--           here is checked by take.lua in the decision's own call, in the caller's slot
-- ARGV[1]   now in milliseconds, or "" to use the Redis server clock (tests pass a value)
-- ARGV[2]   "count" (one event for each rule), "retry" (a request its bans refused: extend
--           those still in force whose rule says so; never an event) or "lift" (end each
--           rule's ban now)
-- ARGV[3..] one per ban rule: eight little-endian int64: the gate's record id G, threshold N,
--           window_ms, ban_ms, factor, max_ms, memory_ms, flags (1 = shadow, 2 = retries
--           during a ban extend it)
--
-- Records, in take.lua's layout (the key's expiry int64, then per record rule id int32,
-- level, stamp, period int64, little-endian); ids are negative, apart from the rules' ids:
--   G      the ban, read by take.lua as a gate of capacity GATE units refilling 1 per ms:
--          level GATE - D at stamp = the ban's start, so it refuses until start + D
--   G - 1  the events: a token bucket of N events per window (an event is window_ms units,
--          the refill N units per ms); banned when an event leaves less than one event's room,
--          so the Nth event within the window bans
--   G - 2  the history: level = the bans within memory, stamp = the last one's start,
--          period = its length
-- A ban starting clears the events; the key lives until its last record is of no more use.
--
-- Returns, per rule, {outcome, until_ms, times, now_ms}: 0 counted, 1 banned now, 2 banned already
-- (extended when the rule says so), 3 a would-be ban (shadow: the events start over, the
-- history is kept, no ban is written), 4 lifted, 5 not banned (nothing to lift or extend).

local GATE, SLACK_MS, YEAR_MS = 1000, 1000, 366 * 24 * 3600 * 1000
local unpack_, pack = struct.unpack, struct.pack
local now = ARGV[1]
now = now ~= '' and tonumber(now)
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local key = KEYS[1]
local value = redis.call('GET', key)
local expiry, order, records = 0, {}, {}
if value and #value >= 8 and (#value - 8) % 28 == 0 then
  expiry = unpack_('<i8', value)
  for a = 9, #value, 28 do
    local id, level, stamp, period = unpack_('<i4i8i8i8', value, a)
    order[#order + 1] = id
    records[id] = {level, stamp, period}
  end
end
local function put(id, level, stamp, period)
  if not records[id] then order[#order + 1] = id end
  records[id] = {level, stamp, period}
end

local lift, retry = ARGV[2] == 'lift', ARGV[2] == 'retry'
local need = 0  -- the latest moment a record written here is of use
local reply = {}
for i = 3, #ARGV do
  local gate_id, threshold, window, ban, factor, longest, memory, flags =
    unpack_('<i8i8i8i8i8i8i8i8', ARGV[i])
  local gate, history = records[gate_id], records[gate_id - 2]
  local banned_until = gate and gate[2] + GATE - gate[1] or 0
  local times = history and history[1] or 0
  if lift then
    if banned_until > now then
      records[gate_id] = nil
      reply[#reply + 1] = {4, now, times, now}
    else
      reply[#reply + 1] = {5, 0, times, now}
    end
  elseif banned_until > now then
    if flags % 4 >= 2 then  -- retries extend: the ban starts again, as long as it was
      local length = history and history[3] or ban
      put(gate_id, GATE - length, now, GATE)
      banned_until = now + length
      if banned_until > need then need = banned_until end
    end
    reply[#reply + 1] = {2, banned_until, times, now}
  elseif retry then  -- the ban ended or was lifted since it refused: nothing to extend
    reply[#reply + 1] = {5, 0, times, now}
  else
    local events = records[gate_id - 1]
    local room = threshold * window
    local level = room
    if events and events[3] == window then
      level = events[1]
      if now > events[2] then level = level + (now - events[2]) * threshold end
      if level > room then level = room end
    end
    level = level - window
    if level < window then
      times = (history and now - history[2] <= memory) and times + 1 or 1
      local length = ban
      for _ = 2, times do
        length = length * factor
        if length >= longest then break end
      end
      if length > longest then length = longest end
      records[gate_id - 1] = nil
      put(gate_id - 2, times, now, length)
      if now + memory > need then need = now + memory end
      if flags % 2 == 1 then
        reply[#reply + 1] = {3, now + length, times, now}
      else
        put(gate_id, GATE - length, now, GATE)
        if now + length > need then need = now + length end
        reply[#reply + 1] = {1, now + length, times, now}
      end
    else
      put(gate_id - 1, level, now, window)
      local full_at = now + math.ceil((room - level) / threshold)
      if full_at > need then need = full_at end
      reply[#reply + 1] = {0, 0, times, now}
    end
  end
end

local parts = {}
for j = 1, #order do
  local id = order[j]
  local record = records[id]
  if record then parts[#parts + 1] = pack('<i4i8i8i8', id, record[1], record[2], record[3]) end
end
if #parts == 0 then
  redis.call('DEL', key)
  return reply
end
if need + SLACK_MS > expiry then expiry = need + SLACK_MS end
local px = expiry - now
if px < 1 then px = 1 end
redis.call('SET', key, pack('<i8', expiry) .. table.concat(parts), 'PX', px)
return reply
