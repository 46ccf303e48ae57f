-- load: append one batch of pre-split amounts to a sub-pool's stock.
--
-- KEYS[1] meta   rain:{P:j}:meta   (hash)
-- KEYS[2] stock  rain:{P:j}:stock  (list of amounts in cents)
-- ARGV[1] batch number (0, 1, ...); ARGV[2..] the batch's amounts
--
-- Batches are applied in order and exactly once: a batch whose number is not
-- the sub-pool's next_batch is skipped, so a preload that died midway can be
-- run again from the start and resumes where the stock stopped.
-- The amounts go to the stock by load_stock (prelude.lua).
-- Returns {result, next_batch} with result "loaded", "skipped", "open" (loaded
-- already), or "closed" (its pool closed: nothing is appended, ever).
local meta = KEYS[1]
local k = {meta = meta, stock = KEYS[2]}
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
load_stock(k, ARGV, 2)
redis.call('HSET', meta, 'next_batch', next_batch + 1)
write_books(k)
return {'loaded', next_batch + 1}
