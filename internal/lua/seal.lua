-- seal: the first step of closing a sub-pool: check, atomically, that
-- nothing can move in it any more, and stop it from granting for good.
--
-- KEYS[1] meta     rain:{P:j}:meta
-- KEYS[2] outbox   rain:{P:j}:outbox
-- ARGV[1] "seal" or "unseal" (a close that failed on another sub-pool puts
--         this one back)
-- ARGV[2] owner: the close's own token (random, one per Close call)
-- ARGV[3] lease in ms: how long a seal belongs to its owner alone
--
-- Sealed when: its window has ended (recorded as ended, or by the shard's
-- clock; sealing records it), no grant is held
-- (each was confirmed or released), no spill is in flight out of it, and its
-- outbox is empty (settlement acknowledged, and so trimmed, every entry).
-- A sealed sub-pool's state is "closing", with its owner and the time it was
-- sealed: claims answer "ended", takes "closed", adopts refuse.
--
-- A seal has an owner, so that concurrent closes never undo each other's
-- work: sealing a sub-pool this owner sealed answers as the first time (a
-- re-sent seal, or the owner's close run again); one sealed by another owner
-- within the lease answers "sealing" (another close is at work); once the
-- lease has run out (a close that died after sealing), the seal passes to
-- the new owner. Unseal opens only a seal of its own owner.
-- Returns {"sealed", count, cents, stock_count, stock_cents,
--          confirmed_count, confirmed_cents, 1}
--       | {"open", reason, n} with reason "window", "held", "inflight",
--         "unsettled" (n: how many), or "sealing" (n: ms left of the other
--         owner's lease), or "closed" (the sub-pool is closed already)
--       | {"missing"} | {"unsealed"} | {"kept"} (unseal of another's seal)
local meta, outbox = KEYS[1], KEYS[2]
local op, owner, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
local m = redis.call('HMGET', meta, 'state', 'ends_ms', 'held_count', 'inflight_count',
  'count', 'cents', 'stock_count', 'stock_cents', 'confirmed_count', 'confirmed_cents',
  'seal_owner', 'sealed_ms', 'ended')
if not m[1] then
  return {'missing'}
end
if op == 'unseal' then
  if m[1] == 'closing' and m[11] == owner then
    redis.call('HSET', meta, 'state', 'open')
    redis.call('HDEL', meta, 'seal_owner', 'sealed_ms')
    return {'unsealed'}
  end
  return {'kept'}
end
local function n(v) return tonumber(v) or 0 end
local sealed = {'sealed', n(m[5]), n(m[6]), n(m[7]), n(m[8]), n(m[9]), n(m[10]), 1}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if m[1] == 'closing' then
  if m[11] ~= owner then
    local left = n(m[12]) + lease - now
    if m[11] and left > 0 then
      return {'open', 'sealing', left}
    end
    redis.call('HSET', meta, 'seal_owner', owner, 'sealed_ms', string.format('%d', now))
  end
  return sealed
end
if m[1] == 'closed' then
  return {'open', 'closed', 0}
end
local ends = n(m[2])
if m[1] ~= 'open' or (m[13] ~= '1' and (ends == 0 or ends > now)) then
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
redis.call('HSET', meta, 'state', 'closing', 'seal_owner', owner, 'sealed_ms', string.format('%d', now), 'ended', '1')
return sealed
