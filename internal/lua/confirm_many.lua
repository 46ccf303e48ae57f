-- confirm_many: settlement confirms a batch of grants of one sub-pool, each
-- as confirm.lua confirms one, in order, atomically.
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] grants     rain:{P:j}:grants
-- KEYS[3] deadlines  rain:{P:j}:deadlines
-- ARGV[1] "1": fence (a grant answered "already" moves the meta's resent
--         counter, so a WAIT after the script covers that earlier confirm:
--         see claim_many.lua); "0": none
-- ARGV[2], ARGV[3], ARGV[4]: user id, serial and amount (cents, as the
--         outbox entry says) of the first grant; then the next grant's
--         three, ...
--
-- Confirms only a held grant with that serial and that amount, whatever its
-- deadline (a grant still held has not been released, so confirming it is
-- safe); confirming again is a no-op. What settlement pays is the outbox
-- entry's amount: an entry whose amount is not the grant's is refused
-- ("amount", nothing changes), so that nothing is paid but what was granted.
-- Sent again after a lost reply, every answer is "already" where the first
-- run said "confirmed": the same effect. The move: confirm_held
-- (prelude.lua), the counters written once for the batch.
-- Returns one reply per grant: {"confirmed", amount} | {"already", amount}
--   | {"released"} | {"mismatch"} (another serial) | {"unknown"} (no grant)
--   | {"amount", amount} (the grant's amount is another)
--   | {"error", message} (a bad grant record); an error, nothing written,
--   when the sub-pool's meta is not here
local meta, grants = KEYS[1], KEYS[2]
local k = {meta = meta, grants = grants, deadlines = KEYS[3]}
-- A sub-pool's meta outlives it (a closed one keeps its tombstone): none
-- here means the sub-pool's keys are not on this node (a slot's keys split
-- between two primaries by a move broken off and its state lost). Refused,
-- nothing written: "unknown" for each grant would have settlement
-- acknowledge them unpaid while they are held elsewhere.
if redis.call('EXISTS', meta) == 0 then
  return redis.error_reply('RAINSTATE no sub-pool ' .. meta .. ' here: its keys are elsewhere, or it never was')
end
local n = (#ARGV - 1) / 3
local users = {}
for i = 1, n do
  users[i] = ARGV[3 * i - 1]
end
local earlier = false -- a grant answered "already": confirmed before this run
local recs = redis.call('HMGET', grants, unpack(users))
local out = {}
local done = {} -- user -> serial confirmed in this batch
for i = 1, n do
  local user, serial, want = users[i], ARGV[3 * i], ARGV[3 * i + 1]
  local g = recs[i]
  if done[user] then
    g = 'c:' .. done[user]
  end
  if not g then
    out[i] = {'unknown'}
  else
    local st, amount, ser = string.match(g, '^(%a):(%d+):(%d+)')
    if st == nil then
      out[i] = {'error', 'RAINSTATE bad grant record for ' .. user}
    elseif ser ~= serial then
      out[i] = {'mismatch'}
    elseif amount ~= want then
      out[i] = {'amount', tonumber(amount)}
    elseif st == 'c' then
      out[i] = {'already', tonumber(amount)}
      earlier = earlier or not done[user]
    elseif st == 'r' then
      out[i] = {'released'}
    else
      confirm_held(k, user, g)
      done[user] = string.sub(g, 3)
      out[i] = {'confirmed', tonumber(amount)}
    end
  end
end
if ARGV[1] == '1' and earlier then
  redis.call('HINCRBY', meta, 'resent', 1)
end
write_books(k)
return out
