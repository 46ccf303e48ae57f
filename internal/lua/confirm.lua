-- confirm: settlement confirms a held grant; it leaves the held state for good.
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] grants     rain:{P:j}:grants
-- KEYS[3] deadlines  rain:{P:j}:deadlines
-- ARGV[1] user id   ARGV[2] serial
--
-- Confirms only a held grant with that serial, whatever its deadline: a grant
-- still held has not been released, so confirming it is safe (the reaper
-- releases only what is still held). Confirming again is a no-op. The move:
-- confirm_held (prelude.lua).
-- Returns {"confirmed", amount} | {"already", amount} | {"released"} |
--         {"mismatch"} (another serial) | {"unknown"} (no grant for the user)
local grants = KEYS[2]
local k = {meta = KEYS[1], grants = grants, deadlines = KEYS[3]}
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
confirm_held(k, user, g)
write_books(k)
return {'confirmed', tonumber(amount)}
