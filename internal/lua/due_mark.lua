-- due_mark: a grab marks sub-pools of one shard as having work for the
-- reaper (a grant held, a spill's transfer in flight), in the shard's due
-- index.
--
-- KEYS[1] at   rain:{due}:at   sorted set: sub-pool (its meta key) -> when
--                               the reaper should look next (unix ms, the
--                               shard's clock)
-- KEYS[2] gen  rain:{due}:gen  hash: sub-pool -> "marks:last mark's unix ms"
-- ARGV[1] how long after now the reaper should first look, in ms
-- ARGV[2] "keep" or "sooner"
-- ARGV[3..] the sub-pools' meta keys
--
-- keep (a grant made): a sub-pool already in the index keeps its time (the
-- reaper set it from what is held there, and a grant made now falls due no
-- sooner); one not in it is due ARGV[1] from now. sooner (a transfer taken
-- for a spill): the sub-pool is due ARGV[1] from now unless it is due
-- sooner already: a transfer may need the reaper within the spill's age,
-- long before the grants held there fall due. Every mark counts in gen,
-- with its time, so a reaper that found nothing to do there does not drop
-- a sub-pool marked since it read it, or marked a moment before
-- (due_done.lua).
local at, gen = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first = now + tonumber(ARGV[1])
local mode = 'NX'
if ARGV[2] == 'sooner' then
  mode = 'LT'
elseif ARGV[2] ~= 'keep' then
  return redis.error_reply('RAINSTATE due_mark: mode ' .. tostring(ARGV[2]) .. ', want keep or sooner')
end
for i = 3, #ARGV do
  redis.call('ZADD', at, mode, first, ARGV[i])
  local marks = tonumber((string.match(redis.call('HGET', gen, ARGV[i]) or '', '^(%d+)'))) or 0
  redis.call('HSET', gen, ARGV[i], (marks + 1) .. ':' .. now)
end
return #ARGV - 2
