-- end: end a sub-pool's window now (the operator's end), or keep the end it
-- has when that came first.
--
-- KEYS[1] meta   rain:{P:j}:meta
--
-- From then on every claim answers "ended" (a user who holds a grant still
-- gets it back); held grants run out their hold as before. The end is
-- recorded as a fact (ended = 1), which the scripts read before the clock,
-- so a clock that goes back never opens the window again. Ending again
-- changes nothing.
-- Returns {ends_ms} (the shard's clock), or {-1} when the sub-pool has no
-- meta record.
local meta = KEYS[1]
local ends = redis.call('HGET', meta, 'ends_ms')
if not ends then
  return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
ends = tonumber(ends)
if redis.call('HGET', meta, 'ended') ~= '1' and (ends == 0 or ends > now) then
  ends = now
  redis.call('HSET', meta, 'ends_ms', string.format('%d', now))
end
redis.call('HSET', meta, 'ended', '1')
return {ends}
