-- due_done: the reaper swept a sub-pool of the due index and says when it
-- next needs a look, or that it has nothing to do.
--
-- KEYS[1] at   rain:{due}:at    KEYS[2] gen  rain:{due}:gen
-- ARGV[1] the sub-pool's meta key   ARGV[2] its marks when the reaper read it
-- ARGV[3] when to look next, unix ms; -1: nothing to do there
--
-- A sub-pool with nothing to do leaves the index only if nobody marked it
-- since the reaper read it (a grant made after the sweep looked is swept
-- again). Returns 1 when it left the index, else 0.
local at, gen = KEYS[1], KEYS[2]
local m, seen, next = ARGV[1], ARGV[2], tonumber(ARGV[3])
if next >= 0 then
  redis.call('ZADD', at, 'XX', next, m)
  return 0
end
if (redis.call('HGET', gen, m) or '0') ~= seen then
  return 0
end
redis.call('ZREM', at, m)
redis.call('HDEL', gen, m)
return 1
