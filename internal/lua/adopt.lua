-- adopt: step 3 of a spill, at the user's home h: turn the reservation into a
-- held grant of the amount taken from sibling j.
--
-- KEYS[1] meta       rain:{P:h}:meta
-- KEYS[2] grants     rain:{P:h}:grants
-- KEYS[3] deadlines  rain:{P:h}:deadlines
-- KEYS[4] outbox     rain:{P:h}:outbox
-- KEYS[5] reserve    rain:{P:h}:reserve
-- KEYS[6] verdicts   rain:{P:h}:verdicts   (hash: token -> verdict, kept for the pool's life)
-- ARGV[1] user  ARGV[2] token  ARGV[3] serial  ARGV[4] amount  ARGV[5] origin j
-- ARGV[6] reservation validity in ms (T)
-- ARGV[7] "1": fence (an adopt answered from an earlier run moves the
--         meta's resent counter, so a WAIT after it covers that adopt: see
--         claim_many.lua); "0": none
--
-- It records the verdict on the token, once, here or in decide.lua:
-- "a:origin:amount:deadline_ms:user" (adopted: the amount taken from origin
-- is a grant here) or "r:user" (refused: the sibling must put the amount
-- back). The protocol: docs/architecture.md#the-spill-protocol.
--
-- Adopt grants (adopt_to_held, prelude.lua) only if the home is open (not
-- sealed by a close) and its window has not ended, the user's reservation
-- still carries this token and is younger than T by this shard's clock,
-- and the user holds no grant; otherwise it records a refusal. A home that
-- is closed (its tombstone, retire.lua) or was never set up refuses and
-- writes nothing. Re-sent, it answers as the first run did: the same
-- grant, or a refusal.
-- Returns {"granted", amount, serial, deadline_ms} | {"stale"} | {"ended"}
--   (refused, and the window has ended: the grab answers ended)
local meta, grants, reserve, verdicts = KEYS[1], KEYS[2], KEYS[5], KEYS[6]
local k = {meta = meta, grants = grants, deadlines = KEYS[3], outbox = KEYS[4]}
local user, token, serial, amount, origin = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local validity = tonumber(ARGV[6])
local m = redis.call('HMGET', meta, 'state', 'hold_ms', 'pool', 'index', 'ends_ms', 'ended')
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local ends = tonumber(m[5]) or 0
-- A refusal answers "ended" once the window has ended: a window never ends
-- later than it did, so a refusal for the end answers the same when re-sent.
local refused = {'stale'}
if m[6] == '1' or (ends > 0 and now >= ends) then
  refused = {'ended'}
end
local v = redis.call('HGET', verdicts, token)
if v then
  local vorigin, vamount, vdeadline, vuser = string.match(v, '^a:(%d+):(%d+):(%d+):(.*)$')
  if vorigin == origin and vamount == amount and vuser == user then
    if ARGV[7] == '1' then
      redis.call('HINCRBY', meta, 'resent', 1)
    end
    return {'granted', tonumber(amount), tonumber(serial), tonumber(vdeadline)} -- sent again
  end
  return refused -- refused, or adopted from another sibling: this amount goes back
end
local function refuse()
  redis.call('HSET', verdicts, token, 'r:' .. user)
  return refused
end
if m[1] == 'closing' then
  return refuse() -- sealed by a close (seal.lua): it grants nothing more
end
if m[1] ~= 'open' then
  return refused -- closed (a tombstone) or never set up: nothing is written
end
if refused[1] == 'ended' then
  return refuse()
end
local r = redis.call('HGET', reserve, user)
if not r then
  return refuse()
end
local rtoken, ts = string.match(r, '^(.+):(%d+)$')
if rtoken ~= token or now - tonumber(ts) >= validity then
  return refuse()
end
local g = redis.call('HGET', grants, user)
if g and string.sub(g, 1, 1) ~= 'r' then
  redis.call('HDEL', reserve, user)
  return refuse() -- the user holds a grant already: the caller puts the amount back
end
local deadline = string.format('%d', now + tonumber(m[2]))
k.pool, k.index = m[3], m[4]
adopt_to_held(k, user, amount, serial, deadline, origin)
redis.call('HSET', verdicts, token, 'a:' .. origin .. ':' .. amount .. ':' .. deadline .. ':' .. user)
redis.call('HDEL', reserve, user)
write_books(k)
-- A new holder: instances that read this pool's holders drop them (events).
redis.call('PUBLISH', 'rain:events', 'stock ' .. m[3] .. ' ' .. m[4])
return {'granted', tonumber(amount), tonumber(serial), tonumber(deadline)}
