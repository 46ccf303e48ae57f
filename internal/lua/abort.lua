-- abort: no sibling had stock: refuse the spill token at home h and drop the
-- user's reservation, if it is still this one.
--
-- KEYS[1] reserve   rain:{P:h}:reserve
-- KEYS[2] verdicts  rain:{P:h}:verdicts
-- ARGV[1] user   ARGV[2] token
--
-- The refusal is recorded like decide's, so a late adopt of the token can
-- never grant. Re-sent, it answers as the first run did.
-- Returns {"aborted"} | {"adopted"} (the token was adopted: nothing to abort)
local reserve, verdicts = KEYS[1], KEYS[2]
local user, token = ARGV[1], ARGV[2]
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
