-- due_read: the reaper reads the sub-pools of one shard that are due.
--
-- KEYS[1] at   rain:{due}:at    KEYS[2] gen  rain:{due}:gen
-- ARGV[1] how many due sub-pools to skip (those this pass could not move)
-- ARGV[2] most sub-pools to return
--
-- Returns {next_in_ms, sub-pool1, gen1, sub-pool2, gen2, ...}: the
-- sub-pools whose time has come by the shard's clock, earliest first, each
-- with its marks (for due_done.lua), and how long until the earliest one
-- not due yet is (-1: none).
local at, gen = KEYS[1], KEYS[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGE', at, '-inf', now, 'BYSCORE', 'LIMIT', tonumber(ARGV[1]), tonumber(ARGV[2]))
local out = {-1}
for _, m in ipairs(due) do
  table.insert(out, m)
  table.insert(out, redis.call('HGET', gen, m) or '0')
end
local later = redis.call('ZRANGE', at, '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
if #later > 0 then
  out[1] = tonumber(later[2]) - now
end
return out
