-- watermark: raise a copy of the highest reserved grant serial (internal/idgen).
--
-- KEYS[1] rain:serial:watermark   (on every shard but the serial shard)
-- ARGV[1] the end of a segment just reserved
--
-- Only ever raised, so copies written in any order, or written again, end
-- at the highest. Returns the stored value.
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = tonumber(ARGV[1])
if v > cur then
  redis.call('SET', KEYS[1], ARGV[1])
  return v
end
return cur
