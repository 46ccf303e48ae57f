-- transfers: recovery, at sibling j: drop reservations older than T here (as
-- a home), and list the transfers out of here older than T + margin (as a
-- sibling), for the reaper to resolve by asking their homes.
--
-- KEYS[1] reserve    rain:{P:j}:reserve
-- KEYS[2] transfers  rain:{P:j}:transfers
-- ARGV[1] T in ms   ARGV[2] margin in ms
--
-- A reservation older than T can no longer be adopted (adopt checks T on
-- the same clock), so dropping it is safe. A transfer older than T + margin
-- was made under a reservation that is older than T by now, as long as the
-- shards' clocks differ by less than the margin.
-- Returns {dropped_reservations, token1, home1, user1, token2, ...}
local reserve, transfers = KEYS[1], KEYS[2]
local validity, margin = tonumber(ARGV[1]), tonumber(ARGV[2])
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local dropped = 0
local rs = redis.call('HGETALL', reserve)
for i = 1, #rs, 2 do
  local ts = tonumber(string.match(rs[i + 1], ':(%d+)$'))
  if ts == nil or now - ts >= validity then
    redis.call('HDEL', reserve, rs[i])
    dropped = dropped + 1
  end
end
local out = {dropped}
local ts = redis.call('HGETALL', transfers)
for i = 1, #ts, 2 do
  local amount, home, user, at = string.match(ts[i + 1], '^(%d+):(%d+):(.+):(%d+)$')
  if at and now - tonumber(at) >= validity + margin then
    table.insert(out, ts[i])
    table.insert(out, home)
    table.insert(out, user)
  end
end
return out
