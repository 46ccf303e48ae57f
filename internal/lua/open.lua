-- open: let a fully loaded sub-pool grant.
--
-- KEYS[1] meta   rain:{P:j}:meta  (hash)
--
-- The sub-pool opens only when its stock holds exactly the count and cents it
-- was set up with, so no pool grants from partial stock; and only from
-- loading: a sub-pool sealed or closed by its pool's close never opens again.
-- Returns {"open"}, {"incomplete", stock_count, stock_cents} or {"closed"}.
local meta = KEYS[1]
local v = redis.call('HMGET', meta, 'state', 'count', 'cents', 'stock_count', 'stock_cents')
if v[1] == false then
  return redis.error_reply('RAINSTATE sub-pool has no meta record')
end
if v[1] == 'open' then
  return {'open'}
end
if v[1] ~= 'loading' then
  return {'closed'}
end
if v[2] ~= v[4] or v[3] ~= v[5] then
  return {'incomplete', tonumber(v[4]), tonumber(v[5])}
end
redis.call('HSET', meta, 'state', 'open')
return {'open'}
