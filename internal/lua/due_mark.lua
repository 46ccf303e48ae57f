-- due_mark: a grab marks sub-pools of one shard as having work for the
-- reaper (a grant held, a spill's transfer in flight), in the shard's due
-- index.
--
-- KEYS[1] at   rain:{due}:at   sorted set: sub-pool (its meta key) -> when
--                               the reaper should look next (unix ms)
-- KEYS[2] gen  rain:{due}:gen  hash: sub-pool -> marks made so far
-- ARGV[1] when the reaper should first look, unix ms   ARGV[2..] the
-- sub-pools' meta keys
--
-- A sub-pool already in the index keeps its time (the reaper set it from
-- what is held there, and a grant made now falls due no sooner); one not in
-- it is due at ARGV[1]. Every mark counts in gen, so a reaper that found nothing
-- to do there does not drop a sub-pool marked meanwhile (due_done.lua).
local at, gen = KEYS[1], KEYS[2]
for i = 2, #ARGV do
  redis.call('ZADD', at, 'NX', ARGV[1], ARGV[i])
  redis.call('HINCRBY', gen, ARGV[i], 1)
end
return #ARGV - 1
