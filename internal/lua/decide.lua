-- decide: recovery of a spill, at the user's home h: the verdict on a token
-- whose transfer has been in flight too long. If the home has not decided
-- the token yet (adopt never ran, or ran and refused), it refuses it now,
-- for good: a later adopt of the token answers stale.
--
-- KEYS[1] meta      rain:{P:h}:meta
-- KEYS[2] reserve   rain:{P:h}:reserve
-- KEYS[3] verdicts  rain:{P:h}:verdicts
-- ARGV[1] token   ARGV[2] user
-- ARGV[3] "1": fence (a verdict found, recorded before, moves the meta's
--         resent counter, so a WAIT after it covers that verdict: see
--         claim_many.lua); "0": none
--
-- A home that is closed (its tombstone, retire.lua) or was never set up
-- refuses and writes nothing: adopt there writes nothing either.
--
-- The caller acks the transfer on "adopted" from its sibling with its
-- amount, and untakes it on anything else (the protocol:
-- docs/architecture.md#the-spill-protocol).
-- Returns {"adopted", origin, amount, deadline_ms} | {"refused"}
local meta, reserve, verdicts = KEYS[1], KEYS[2], KEYS[3]
local token, user = ARGV[1], ARGV[2]
local st = redis.call('HGET', meta, 'state')
if not st or st == 'closed' then
  return {'refused'}
end
local v = redis.call('HGET', verdicts, token)
if v then
  if ARGV[3] == '1' then
    redis.call('HINCRBY', meta, 'resent', 1)
  end
  local origin, amount, deadline = string.match(v, '^a:(%d+):(%d+):(%d+):')
  if origin then
    return {'adopted', tonumber(origin), tonumber(amount), tonumber(deadline)}
  end
  return {'refused'}
end
redis.call('HSET', verdicts, token, 'r:' .. user)
local r = redis.call('HGET', reserve, user)
if r and string.match(r, '^(.+):%d+$') == token then
  redis.call('HDEL', reserve, user)
end
return {'refused'}
