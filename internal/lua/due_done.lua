-- due_done: the reaper swept a sub-pool of the due index (or could not)
-- and says when it next needs a look, or that it has nothing to do.
--
-- KEYS[1] at   rain:{due}:at    KEYS[2] gen  rain:{due}:gen
-- ARGV[1] the sub-pool's meta key   ARGV[2] its marks when the reaper read it
-- ARGV[3] look again this many ms from now; -1: nothing to do there
-- ARGV[4] quiet, in ms: how long after its last mark a sub-pool may leave
--
-- A sub-pool with nothing to do leaves the index only if nobody marked it
-- since the reaper read it (else it stays due: looked at again next pass),
-- nor within quiet before now: a grab marks a sub-pool at most every so
-- often, and a grant it made meanwhile, unmarked, may have landed after the
-- reaper looked (then the sub-pool is looked at again once quiet has
-- passed). A sub-pool with work is looked at again when the reaper says,
-- or, marked since the reaper read it, within quiet at the latest: the mark
-- may be a spill's transfer taken after the reaper looked for transfers,
-- which needs a look long before the grants held there fall due. Returns 1
-- when it left the index, 2 when its time moved on, 0 when it stays due.
local at, gen = KEYS[1], KEYS[2]
local m, seen, later, quiet = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call('HGET', gen, m) or '0'
if later >= 0 then
  if cur ~= seen then
    later = math.min(later, quiet)
  end
  redis.call('ZADD', at, 'XX', now + later, m)
  return 2
end
if cur ~= seen then
  return 0
end
local last = tonumber((string.match(cur, ':(%d+)$'))) or 0
if now - last < quiet then
  redis.call('ZADD', at, 'XX', last + quiet, m)
  return 2
end
redis.call('ZREM', at, m)
redis.call('HDEL', gen, m)
return 1
