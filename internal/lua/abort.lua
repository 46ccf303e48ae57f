-- abort: the spill ends without a grant: drop the user's reservation at home
-- h, if it is still this one, and, when an amount may be in flight under
-- the token, refuse the token (docs/architecture.md#the-spill-protocol).
--
-- KEYS[1] meta      rain:{P:h}:meta
-- KEYS[2] reserve   rain:{P:h}:reserve
-- KEYS[3] verdicts  rain:{P:h}:verdicts
-- ARGV[1] user   ARGV[2] token
-- ARGV[3] "refuse": a take under the token may have run (its answer was
--         lost), so the refusal is recorded like decide's and a late adopt
--         of the token can never grant; "drop": nothing was taken (every
--         sibling answered empty), no adopt will ever be sent, and nothing
--         is recorded: a sold-out pool's flood leaves no record behind.
--
-- At a home that is closed (its tombstone) or was never set up nothing is
-- written (adopt refuses there anyway). Re-sent, it answers as the first
-- run did.
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
if not v and ARGV[3] == 'refuse' then
  redis.call('HSET', verdicts, token, 'r:' .. user)
end
local r = redis.call('HGET', reserve, user)
if r and string.match(r, '^(.+):%d+$') == token then
  redis.call('HDEL', reserve, user)
end
return {'aborted'}
