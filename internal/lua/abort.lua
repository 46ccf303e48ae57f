-- abort: no sibling had stock: refuse the spill token at home h and drop the
-- user's reservation, if it is still this one.
--
-- KEYS[1] meta      rain:{P:h}:meta
-- KEYS[2] reserve   rain:{P:h}:reserve
-- KEYS[3] verdicts  rain:{P:h}:verdicts
-- ARGV[1] user   ARGV[2] token
--
-- The refusal is recorded like decide's, so a late adopt of the token can
-- never grant; at a home that is closed (its tombstone) or was never set up
-- nothing is written (adopt refuses there anyway). Re-sent, it answers as the
-- first run did.
-- Returns {"aborted"} | {"adopted"} (the token was adopted: nothing to abort)
local meta, reserve, verdicts = KEYS[1], KEYS[2], KEYS[3]
local user, token = ARGV[1], ARGV[2]
local st = redis.call('HGET', meta, 'state')
if not st or st == 'closed' then
  return {'aborted'}
end
local v = redis.call('HGET', verdicts, token)
if v and string.sub(v, 1, 1) == 'a' then
  return {'adopted'}
end
if not v then
  redis.call('HSET', verdicts, token, 'r:' .. user)
end
local r = redis.call('HGET', reserve, user)
if r and string.match(r, '^(.+):%d+$') == token then
  redis.call('HDEL', reserve, user)
end
return {'aborted'}
