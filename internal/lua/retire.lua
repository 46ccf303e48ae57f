-- retire: the last step of closing a sub-pool: free its keys and leave a
-- tombstone, so that nothing can bring it back.
--
-- KEYS    every key of the sub-pool, in the order of Keys.All(): KEYS[1] meta,
--         KEYS[5] outbox
-- ARGV[1] pool id   ARGV[2] sub-pool index  (the tombstone's)
--
-- The pool's account is recorded (its record says closing) before any
-- sub-pool retires. Retiring unlinks every key but the meta (UNLINK frees a
-- big value in the background), and replaces the meta by a tombstone: a
-- hash of the state "closed", the pool and the index, about a hundred
-- bytes. Every script that could write to the sub-pool reads the meta
-- first and writes nothing to a closed one: a preload stalled before the
-- close (setup, load, open), a late step of a spill (take, adopt, decide,
-- abort), settlement's consumer group (group.lua).
--
-- It retires a sealed sub-pool (state closing), or one whose seal was put
-- back by a concurrent close whose checks failed while it still cannot
-- move (open, its window ended, nothing held, no spill in flight, its
-- outbox empty); anything else is refused and changes nothing. A missing
-- meta (freed by a close of an earlier version) gets its tombstone.
-- Retiring again changes nothing.
-- Returns {"retired"} | {"refused", state}
local meta = KEYS[1]
local m = redis.call('HMGET', meta, 'state', 'ends_ms', 'held_count', 'inflight_count', 'ended')
if m[1] == 'closed' then
  return {'retired'}
end
if m[1] and m[1] ~= 'closing' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ends = tonumber(m[2]) or 0
  local ended = m[5] == '1' or (ends > 0 and ends <= now)
  if m[1] ~= 'open' or not ended or (tonumber(m[3]) or 0) > 0 or (tonumber(m[4]) or 0) > 0
    or redis.call('XLEN', KEYS[5]) > 0 then
    return {'refused', m[1]}
  end
end
local rest = {}
for i = 2, #KEYS do
  rest[#rest + 1] = KEYS[i]
end
redis.call('UNLINK', unpack(rest))
redis.call('DEL', meta)
redis.call('HSET', meta, 'state', 'closed', 'pool', ARGV[1], 'index', ARGV[2])
return {'retired'}
