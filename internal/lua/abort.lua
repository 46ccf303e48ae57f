-- abort: no sibling had stock: drop the user's reservation at home h, if it
-- is still this one.
--
-- KEYS[1] reserve  rain:{P:h}:reserve
-- ARGV[1] user   ARGV[2] token
-- Returns {"aborted"} | {"gone"}
local r = redis.call('HGET', KEYS[1], ARGV[1])
if r and string.match(r, '^(.+):%d+$') == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return {'aborted'}
end
return {'gone'}
