-- ack: step 4 of a spill, at sibling j: the home granted the transfer; drop it.
-- untake: the home did not (stale, or abandoned): put the amount back.
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] stock      rain:{P:j}:stock
-- KEYS[3] transfers  rain:{P:j}:transfers
-- ARGV[1] token   ARGV[2] "ack" or "untake"
--
-- Both are idempotent: a transfer already gone answers "gone".
-- Returns {"acked"} | {"returned"} | {"gone"}
local meta, stock, transfers = KEYS[1], KEYS[2], KEYS[3]
local token, op = ARGV[1], ARGV[2]
local t = redis.call('HGET', transfers, token)
if not t then
  return {'gone'}
end
local amount = string.match(t, '^(%d+):')
redis.call('HDEL', transfers, token)
redis.call('HINCRBY', meta, 'inflight_count', -1)
redis.call('HINCRBY', meta, 'inflight_cents', '-' .. amount)
if op == 'ack' then
  redis.call('HINCRBY', meta, 'sent_count', 1)
  redis.call('HINCRBY', meta, 'sent_cents', amount)
  return {'acked'}
end
redis.call('RPUSH', stock, amount)
redis.call('HINCRBY', meta, 'stock_count', 1)
redis.call('HINCRBY', meta, 'stock_cents', amount)
-- Every instance hears it (internal/events): this sub-pool is no longer empty.
local m = redis.call('HMGET', meta, 'pool', 'index')
redis.call('PUBLISH', 'rain:events', 'stock ' .. m[1] .. ' ' .. m[2])
return {'returned'}
