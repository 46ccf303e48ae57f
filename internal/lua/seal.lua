-- seal: the first step of closing a sub-pool: check, atomically, that
-- nothing can move in it any more, and stop it from granting for good.
--
-- KEYS[1] meta     rain:{P:j}:meta
-- KEYS[2] outbox   rain:{P:j}:outbox
-- ARGV[1] "seal" or "unseal" (a close that failed on another sub-pool
--         puts this one back)
--
-- Sealed when: its window has ended (by the shard's clock), no grant is held
-- (each was confirmed or released), no spill is in flight out of it, and its
-- outbox is empty (settlement acknowledged, and so trimmed, every entry).
-- A sealed sub-pool's state is "closing": claims answer "ended", takes
-- "closed". Sealing a sealed sub-pool again answers as the first time.
-- Returns {"sealed", count, cents, stock_count, stock_cents,
--          confirmed_count, confirmed_cents, fresh} (fresh: 1 when this call
--          sealed it, 0 when it was sealed before)
--       | {"open", reason, n} with reason "window", "held", "inflight",
--         "unsettled" (n: how many) | {"missing"} | {"unsealed"}
local meta, outbox = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'state', 'ends_ms', 'held_count', 'inflight_count',
  'count', 'cents', 'stock_count', 'stock_cents', 'confirmed_count', 'confirmed_cents')
if not m[1] then
  return {'missing'}
end
if ARGV[1] == 'unseal' then
  if m[1] == 'closing' then
    redis.call('HSET', meta, 'state', 'open')
  end
  return {'unsealed'}
end
local function n(v) return tonumber(v) or 0 end
local sealed = {'sealed', n(m[5]), n(m[6]), n(m[7]), n(m[8]), n(m[9]), n(m[10]), 0}
if m[1] == 'closing' then
  return sealed
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = n(m[2])
if m[1] ~= 'open' or ends == 0 or ends > now then
  return {'open', 'window', 0}
end
if n(m[3]) > 0 then
  return {'open', 'held', n(m[3])}
end
if n(m[4]) > 0 then
  return {'open', 'inflight', n(m[4])}
end
local pending = redis.call('XLEN', outbox)
if pending > 0 then
  return {'open', 'unsettled', pending}
end
redis.call('HSET', meta, 'state', 'closing')
sealed[8] = 1
return sealed
