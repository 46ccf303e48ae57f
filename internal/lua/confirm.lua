-- confirm: settlement confirms a held grant; it leaves the held state for good.
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] grants     rain:{P:j}:grants
-- KEYS[3] deadlines  rain:{P:j}:deadlines
-- ARGV[1] user id   ARGV[2] serial
--
-- Confirms only a held grant with that serial, whatever its deadline: a grant
-- still held has not been released, so confirming it is safe (the reaper
-- releases only what is still held). Confirming again is a no-op.
-- Returns {"confirmed", amount} | {"already", amount} | {"released"} |
--         {"mismatch"} (another serial) | {"unknown"} (no grant for the user)
local meta, grants, deadlines = KEYS[1], KEYS[2], KEYS[3]
local user, serial = ARGV[1], ARGV[2]
local g = redis.call('HGET', grants, user)
if not g then
  return {'unknown'}
end
local st, amount, ser, deadline = string.match(g, '^(%a):(%d+):(%d+):(%d+)')
if st == nil then
  return redis.error_reply('RAINSTATE bad grant record for ' .. user)
end
if ser ~= serial then
  return {'mismatch'}
end
if st == 'c' then
  return {'already', tonumber(amount)}
end
if st == 'r' then
  return {'released'}
end
redis.call('HSET', grants, user, 'c' .. string.sub(g, 2))
redis.call('ZREM', deadlines, user)
redis.call('HINCRBY', meta, 'version', 1) -- every money move: see audit
redis.call('HINCRBY', meta, 'held_count', -1)
redis.call('HINCRBY', meta, 'held_cents', '-' .. amount)
redis.call('HINCRBY', meta, 'confirmed_count', 1)
redis.call('HINCRBY', meta, 'confirmed_cents', amount)
return {'confirmed', tonumber(amount)}
