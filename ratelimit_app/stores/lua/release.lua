-- Release the concurrency slots one request took (see take.lua: concurrency limits).
--
-- KEYS[1..n]  the limits' sorted sets (one per concurrency rule of the request)
-- ARGV[1]     the request's slot id (8 bytes, the member take.lua added)
--
-- Idempotent: a slot already released (or expired, or never taken) removes nothing.
-- Returns the number of slots released.
local released = 0
for i = 1, #KEYS do
  released = released + redis.call('ZREM', KEYS[i], ARGV[1])
end
return released
