-- load: append one batch of pre-split amounts to a sub-pool's stock.
--
-- KEYS[1] meta   rain:{P:j}:meta   (hash)
-- KEYS[2] stock  rain:{P:j}:stock  (list of amounts in cents)
-- ARGV[1] batch number (0, 1, ...); ARGV[2..] the batch's amounts
--
-- Batches are applied in order and exactly once: a batch whose number is not
-- the sub-pool's next_batch is skipped, so a preload that died midway can be
-- run again from the start and resumes where the stock stopped.
-- Sums stay exact: Lua numbers are doubles, and rain caps a pool at 1e15 cents.
-- Returns {result, next_batch} with result "loaded", "skipped", "open" (loaded
-- already), or "closed" (its pool closed: nothing is appended, ever).
local meta, stock = KEYS[1], KEYS[2]
local v = redis.call('HMGET', meta, 'state', 'next_batch')
if v[1] == false then
  return redis.error_reply('RAINSTATE sub-pool has no meta record')
end
local next_batch = tonumber(v[2]) or 0
if v[1] == 'closing' or v[1] == 'closed' then
  return {'closed', next_batch}
end
if v[1] ~= 'loading' then
  return {'open', next_batch}
end
if tonumber(ARGV[1]) ~= next_batch then
  return {'skipped', next_batch}
end
local n, sum = #ARGV - 1, 0
for i = 2, #ARGV do
  sum = sum + tonumber(ARGV[i])
end
redis.call('RPUSH', stock, unpack(ARGV, 2))
redis.call('HINCRBY', meta, 'version', 1) -- every money move: see audit
redis.call('HINCRBY', meta, 'stock_count', n)
redis.call('HINCRBY', meta, 'stock_cents', string.format('%d', sum))
redis.call('HSET', meta, 'next_batch', next_batch + 1)
return {'loaded', next_batch + 1}
