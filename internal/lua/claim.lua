-- claim: one grab, atomic: return the user's grant or take one amount for them.
--
-- KEYS[1] meta       rain:{P:j}:meta       (hash: state, window, counters)
-- KEYS[2] stock      rain:{P:j}:stock      (list of amounts in cents)
-- KEYS[3] grants     rain:{P:j}:grants     (hash: user -> "state:amount:serial:deadline_ms")
-- KEYS[4] deadlines  rain:{P:j}:deadlines  (zset: user by deadline_ms)
-- KEYS[5] outbox     rain:{P:j}:outbox     (stream of grants for settlement)
-- KEYS[6] reserve    rain:{P:j}:reserve    (hash: user -> "token:ms", spill reservations)
-- ARGV[1] user id   ARGV[2] serial for a new grant (unique to this request)
-- ARGV[3] spill token ("" when the pool has one sub-pool: no reservation)
-- ARGV[4] reservation validity in ms (T)
--
-- Grant states: h held, c confirmed, r released. A user with a held or
-- confirmed grant gets it back unchanged; a released grant does not count.
-- Times come from the shard's clock (TIME), so rain instances' clocks do not matter.
--
-- Re-sent (a reply lost on the wire, the client library sends it again), it
-- answers as the first run did: the grant made under this serial is
-- "granted" again, not "already"; the reservation made under this token is
-- "reserved" again, not "busy".
--
-- Returns one of
--   {"granted", amount, serial, deadline_ms}
--   {"already", amount, serial, deadline_ms}
--   {"empty"}                  no stock left in this sub-pool
--   {"reserved"}               none left here; a reservation with the token is
--                              recorded for a spill from a sibling (valid T ms)
--   {"busy"}                   a reservation younger than T exists: the same
--                              user has a spill in flight; retry shortly
--   {"not_started", ms_left}   before the window
--   {"ended"}                  after the window
--   {"closed"}                 the sub-pool is not open (still loading)
local meta, stock, grants, deadlines, outbox, reserve = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local user, serial, token, validity = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])

local g = redis.call('HGET', grants, user)
if g then
  local st, amount, ser, deadline = string.match(g, '^(%a):(%d+):(%d+):(%d+)$')
  if st == nil then
    return redis.error_reply('RAINSTATE bad grant record for ' .. user)
  end
  if st ~= 'r' then
    if ser == serial then
      return {'granted', tonumber(amount), tonumber(ser), tonumber(deadline)}
    end
    return {'already', tonumber(amount), tonumber(ser), tonumber(deadline)}
  end
end

local m = redis.call('HMGET', meta, 'state', 'hold_ms', 'starts_ms', 'ends_ms', 'pool', 'index')
if m[1] ~= 'open' then
  return {'closed'}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local starts, ends = tonumber(m[3]), tonumber(m[4])
if starts > 0 and now < starts then
  return {'not_started', starts - now}
end
if ends > 0 and now >= ends then
  return {'ended'}
end

-- A reservation younger than T means a grab of this user is taking stock
-- from a sibling right now: granting here too would give the user two.
if token ~= '' then
  local r = redis.call('HGET', reserve, user)
  if r then
    local rtoken, ts = string.match(r, '^(.+):(%d+)$')
    if rtoken == token then
      return {'reserved'} -- this very claim, sent again
    end
    if ts and now - tonumber(ts) < validity then
      return {'busy'}
    end
    redis.call('HDEL', reserve, user) -- older than T: it can no longer be adopted
  end
end
local amount = redis.call('LPOP', stock)
if not amount then
  if token == '' then
    return {'empty'}
  end
  redis.call('HSET', reserve, user, token .. ':' .. now)
  return {'reserved'}
end
local deadline = string.format('%d', now + tonumber(m[2]))
redis.call('HSET', grants, user, 'h:' .. amount .. ':' .. serial .. ':' .. deadline)
redis.call('ZADD', deadlines, deadline, user)
redis.call('XADD', outbox, '*', 'type', 'grant', 'pool', m[5], 'sub', m[6], 'user', user,
  'amount', amount, 'serial', serial, 'deadline_ms', deadline)
redis.call('HINCRBY', meta, 'version', 1) -- every money move: see audit
redis.call('HINCRBY', meta, 'stock_count', -1)
redis.call('HINCRBY', meta, 'stock_cents', '-' .. amount)
redis.call('HINCRBY', meta, 'held_count', 1)
redis.call('HINCRBY', meta, 'held_cents', amount)
return {'granted', tonumber(amount), tonumber(serial), tonumber(deadline)}
