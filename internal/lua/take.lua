-- take: step 2 of a spill, at a sibling j: move one amount into an in-flight
-- transfer, to be granted at the user's home h.
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] stock      rain:{P:j}:stock
-- KEYS[3] transfers  rain:{P:j}:transfers  (hash: token -> "amount:home:ms:user", in flight)
-- KEYS[4] resolved   rain:{P:j}:settled    (hash: token -> "a|u:amount:home:ms:user";
--                                            the key keeps its earlier name)
-- ARGV[1] token   ARGV[2] home sub-pool index   ARGV[3] user id
-- ARGV[4] "1": fence (a take answered from an earlier run moves the meta's
--         resent counter, so a WAIT after it covers that take: see
--         claim_many.lua); "0": none
--
-- A transfer is in flight until ack.lua resolves it by the home's verdict
-- (the protocol: docs/architecture.md#the-spill-protocol).
--
-- The amount stays counted here (inflight) until it is resolved (the move:
-- pop_to_transfer, prelude.lua). Taking again with the same token returns
-- the same transfer; a token already resolved, or stored for another user
-- or home, takes nothing. Nothing is taken once the sub-pool's window has
-- ended (by this shard's clock): a spill that began before the end and
-- comes here after it answers "ended".
-- Returns {"taken", amount} | {"empty"} | {"closed"} | {"ended"}
--   | {"settled"} (the token's transfer is resolved already) | {"conflict"}
local meta, transfers, resolved = KEYS[1], KEYS[3], KEYS[4]
local k = {meta = meta, stock = KEYS[2], transfers = transfers}
local token, home, user = ARGV[1], ARGV[2], ARGV[3]
local st = ''
local t = redis.call('HGET', transfers, token)
if not t then
  t = redis.call('HGET', resolved, token)
  if t then
    st, t = string.match(t, '^(%a):(.*)$')
  end
end
if t then
  local amount, thome, tuser = string.match(t, '^(%d+):(%d+):%d+:(.*)$')
  if thome ~= home or tuser ~= user then
    return {'conflict'}
  end
  if st == '' then
    if ARGV[4] == '1' then
      redis.call('HINCRBY', meta, 'resent', 1)
    end
    return {'taken', tonumber(amount)} -- sent again
  end
  return {'settled'}
end
local m = redis.call('HMGET', meta, 'state', 'ends_ms', 'ended')
if m[1] ~= 'open' then
  return {'closed'}
end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local ends = tonumber(m[2]) or 0
if m[3] == '1' or (ends > 0 and now >= ends) then
  return {'ended'}
end
local amount = pop_to_transfer(k, token, home, user, now)
if not amount then
  return {'empty'}
end
write_books(k)
return {'taken', tonumber(amount)}
