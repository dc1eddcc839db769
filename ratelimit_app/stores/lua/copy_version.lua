#!lua flags=allow-cross-slot-keys
-- Write the config version's copies held by one Redis Cluster node, in one call (see
-- stores/cluster.py: a copy of the version in every slot, so that take.lua can fence on it).
--
-- KEYS        none: the copies lie in every slot the node serves, so they cannot be declared
--             (a call's declared keys share one slot); this script's flag lets it write
--             undeclared keys of several slots, all of them on the node it runs on
-- ARGV[1]     the config version ("<ms>-<hex>")
-- ARGV[2..]   the copies' keys, each in a slot this node serves (a key of another node fails
--             the call there; the caller then writes that node's copies one by one)
--
-- A copy holding a later version (by its ms) is left alone: two writers at once (a publication
-- and a repair) never take a copy back to an older version.
--
-- Returns the number of copies written.

local version = ARGV[1]
local function ms(value)
  return value and tonumber(string.match(value, '^(%d+)')) or -1
end
local new_ms, written = ms(version), 0
for i = 2, #ARGV do
  if ms(redis.call('GET', ARGV[i])) <= new_ms then
    redis.call('SET', ARGV[i], version)
    written = written + 1
  end
end
return written
