-- release: return the amounts of expired grants to the stock (the reaper).
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] stock      rain:{P:j}:stock
-- KEYS[3] grants     rain:{P:j}:grants
-- KEYS[4] deadlines  rain:{P:j}:deadlines
-- KEYS[5] outbox     rain:{P:j}:outbox
-- ARGV[1] most grants to release in this call
--
-- Deadlines are read on the shard's clock (TIME). Each grant is released only
-- if it is still held and past its deadline, checked here, atomically: a
-- stale or concurrent reaper can never release a grant twice, nor one that
-- was confirmed. A released user may grab again.
-- Returns {released, released_cents, oldest_overdue_ms, more, next_ms, held}:
-- oldest_overdue_ms is how long past its deadline the oldest overdue grant
-- was (0 if none); more is 1 when the batch was full and more may be due;
-- next_ms is how long until a grant can next fall due: the earliest
-- deadline left, and at most the hold (a grant made later falls due no
-- sooner), so the reaper need not look before; held is how many grants are
-- still held here (0: the reaper has nothing to do here until a grab marks
-- the sub-pool again).
local meta, stock, grants, deadlines, outbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local limit = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local oldest = 0
if #due > 0 then
  oldest = now - tonumber(due[2])
end
local m = redis.call('HMGET', meta, 'pool', 'index', 'hold_ms')
local n, cents = 0, 0
for i = 1, #due, 2 do
  local user = due[i]
  local g = redis.call('HGET', grants, user)
  redis.call('ZREM', deadlines, user)
  if g then
    local st, amount, ser, deadline = string.match(g, '^(%a):(%d+):(%d+):(%d+)')
    if st == 'h' and tonumber(deadline) <= now then
      redis.call('RPUSH', stock, amount)
      redis.call('HSET', grants, user, 'r' .. string.sub(g, 2))
      redis.call('HINCRBY', meta, 'held_count', -1)
      redis.call('HINCRBY', meta, 'held_cents', '-' .. amount)
      redis.call('HINCRBY', meta, 'stock_count', 1)
      redis.call('HINCRBY', meta, 'stock_cents', amount)
      redis.call('HINCRBY', meta, 'released_count', 1)
      redis.call('HINCRBY', meta, 'released_cents', amount)
      redis.call('XADD', outbox, '*', 'type', 'release', 'pool', m[1], 'sub', m[2], 'user', user,
        'amount', amount, 'serial', ser, 'deadline_ms', deadline)
      n = n + 1
      cents = cents + tonumber(amount)
    end
  end
end
if n > 0 then
  redis.call('HINCRBY', meta, 'version', 1) -- every money move: see audit
  -- Every instance hears it (internal/events): this sub-pool is no longer empty.
  redis.call('PUBLISH', 'rain:events', 'stock ' .. m[1] .. ' ' .. m[2])
end
local more = 0
if #due / 2 >= limit then
  more = 1
end
local nextms = tonumber(m[3]) or 0
local first = redis.call('ZRANGE', deadlines, 0, 0, 'WITHSCORES')
if #first > 0 then
  nextms = math.min(nextms, math.max(0, tonumber(first[2]) - now))
end
return {n, cents, oldest, more, nextms, redis.call('ZCARD', deadlines)}
