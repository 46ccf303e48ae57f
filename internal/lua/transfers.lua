-- transfers: recovery, at sub-pool j: drop reservations older than T here (as
-- a home), and list the transfers out of here still in flight and older than
-- a given age (as a sibling), for the reaper to resolve by asking their homes
-- for a verdict (decide.lua).
--
-- KEYS[1] reserve    rain:{P:j}:reserve
-- KEYS[2] transfers  rain:{P:j}:transfers
-- ARGV[1] T in ms   ARGV[2] age in ms
--
-- Why dropping and resolving these is safe whatever the clocks say:
-- docs/architecture.md#the-spill-protocol.
-- Returns {dropped_reservations, next_ms, in_flight, token1, home1, user1,
-- amount1, token2, ...}: next_ms is how long until a transfer in flight here
-- can next reach the age (the age itself when none is in flight: one taken
-- later reaches it no sooner), in_flight how many are in flight here.
local reserve, transfers = KEYS[1], KEYS[2]
local validity, age = tonumber(ARGV[1]), tonumber(ARGV[2])
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local dropped = 0
local rs = redis.call('HGETALL', reserve)
for i = 1, #rs, 2 do
  local ts = tonumber((string.match(rs[i + 1], ':(%d+)$')))
  if ts == nil or now - ts >= validity then
    redis.call('HDEL', reserve, rs[i])
    dropped = dropped + 1
  end
end
local ts = redis.call('HGETALL', transfers)
local out = {dropped, age, #ts / 2}
for i = 1, #ts, 2 do
  local amount, home, at, user = string.match(ts[i + 1], '^(%d+):(%d+):(%d+):(.*)$')
  if at and now - tonumber(at) >= age then
    table.insert(out, ts[i])
    table.insert(out, home)
    table.insert(out, user)
    table.insert(out, tonumber(amount))
  elseif at then
    out[2] = math.min(out[2], tonumber(at) + age - now)
  end
end
return out
