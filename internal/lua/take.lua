-- take: step 2 of a spill, at a sibling j: move one amount into an in-flight
-- transfer, to be granted at the user's home h.
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] stock      rain:{P:j}:stock
-- KEYS[3] transfers  rain:{P:j}:transfers  (hash: token -> "amount:home:user:ms")
-- ARGV[1] token   ARGV[2] home sub-pool index   ARGV[3] user id
--
-- The amount stays counted here (inflight) until the home acknowledges it
-- (ack) or it comes back (untake). Taking again with the same token returns
-- the same transfer.
-- Returns {"taken", amount} | {"empty"} | {"closed"}
local meta, stock, transfers = KEYS[1], KEYS[2], KEYS[3]
local token, home, user = ARGV[1], ARGV[2], ARGV[3]
local t = redis.call('HGET', transfers, token)
if t then
  return {'taken', tonumber(string.match(t, '^(%d+):'))}
end
if redis.call('HGET', meta, 'state') ~= 'open' then
  return {'closed'}
end
local amount = redis.call('LPOP', stock)
if not amount then
  return {'empty'}
end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
redis.call('HSET', transfers, token, amount .. ':' .. home .. ':' .. user .. ':' .. now)
redis.call('HINCRBY', meta, 'stock_count', -1)
redis.call('HINCRBY', meta, 'stock_cents', '-' .. amount)
redis.call('HINCRBY', meta, 'inflight_count', 1)
redis.call('HINCRBY', meta, 'inflight_cents', amount)
return {'taken', tonumber(amount)}
