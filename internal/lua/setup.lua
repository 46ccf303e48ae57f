-- setup: create a sub-pool's meta record, idempotently, before its stock loads.
--
-- KEYS[1] meta   rain:{P:j}:meta  (hash)
-- ARGV[1] pool id   ARGV[2] sub-pool index
-- ARGV[3] count     ARGV[4] cents        (what this sub-pool must hold when open)
-- ARGV[5] hold_ms   ARGV[6] starts_ms    ARGV[7] ends_ms   (0 = none)
--
-- Returns {state, next_batch}: the existing state when the record is there with
-- the same count and cents; {"closed", 0} for a sub-pool whose pool closed (its
-- tombstone, retire.lua: a preload that stalled past the close creates
-- nothing); an error when it is there with different ones. Its counters
-- start at zero (zero_books, prelude.lua).
local meta = KEYS[1]
if redis.call('EXISTS', meta) == 1 then
  local v = redis.call('HMGET', meta, 'count', 'cents', 'state', 'next_batch')
  if v[3] == 'closed' then
    return {'closed', 0}
  end
  if v[1] ~= ARGV[3] or v[2] ~= ARGV[4] then
    return redis.error_reply('RAINSPEC sub-pool ' .. ARGV[2] .. ' exists with count ' ..
      tostring(v[1]) .. ' cents ' .. tostring(v[2]))
  end
  return {v[3], tonumber(v[4])}
end
redis.call('HSET', meta,
  'pool', ARGV[1], 'index', ARGV[2], 'count', ARGV[3], 'cents', ARGV[4],
  'hold_ms', ARGV[5], 'starts_ms', ARGV[6], 'ends_ms', ARGV[7],
  'state', 'loading', 'next_batch', 0,
  unpack(zero_books()))
return {'loading', 0}
