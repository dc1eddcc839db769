-- The floor: a naive token bucket over every key, written the way most examples are.
-- KEYS: bucket keys (hashes). ARGV: three numbers per key: tokens per ms, capacity, cost.
-- One HMGET per key to read, then one HSET and one PEXPIRE per key to write: the redis.call
-- count grows with 3 per level, which is what makes such a script slower inside Redis.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
local levels = {}
for i = 1, n do
  local rate, capacity, cost = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1]), tonumber(ARGV[3 * i])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens, ts = tonumber(state[1]), tonumber(state[2])
  if tokens == nil then tokens, ts = capacity, now end
  tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
  if tokens < cost then return {0, i} end
  levels[i] = tokens - cost
end
for i = 1, n do
  local rate, capacity = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i - 1])
  redis.call('HSET', KEYS[i], 'tokens', levels[i], 'ts', now)
  redis.call('PEXPIRE', KEYS[i], math.ceil((capacity - levels[i]) / rate) + 1)
end
return {1, 0}
