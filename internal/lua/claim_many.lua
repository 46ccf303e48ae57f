-- claim_many: a batch of grabs on one sub-pool, in one atomic script. Each
-- claim is decided as if it came alone, one after another in the order
-- given; the script's setup (the window, the clock), the stock pops and the
-- counter updates happen once for the whole batch. Its money moves are
-- pop_to_held and release_held (prelude.lua).
--
-- KEYS[1] meta       rain:{P:j}:meta       (hash: state, window, counters)
-- KEYS[2] stock      rain:{P:j}:stock      (list of amounts in cents)
-- KEYS[3] grants     rain:{P:j}:grants     (hash: user -> "state:amount:serial:deadline_ms")
-- KEYS[4] deadlines  rain:{P:j}:deadlines  (zset: a grant's user alone by its deadline_ms)
-- KEYS[5] outbox     rain:{P:j}:outbox     (stream of grants for settlement)
-- KEYS[6] reserve    rain:{P:j}:reserve    (hash: user -> "token:ms", spill reservations)
-- KEYS[7] batches    rain:{P:j}:deadline_batches (zset: a batch's users by their deadline_ms)
-- ARGV[1] reservation validity in ms (T)
-- ARGV[2] "1": fence (the caller WAITs for a replica after this script on
--         the same connection, see below); "0": none
-- ARGV[3] the form of what the grants write (lua.Form): their outbox
--         entries "batch" (one entry of one field for the batch's grants),
--         "packed" (one field per grant) or "fields" (a field per value,
--         what a rain settle before the packed form reads), then " batched"
--         when a batch's grants are named by one member of the deadline
--         index's batches key, which a reaper before that key never reads
--         (see prelude.lua)
-- ARGV[4], ARGV[5], ARGV[6]: user, serial, spill token ("" for pools of one
--         sub-pool) of the first claim; then the next claim's three, ...
--
-- Each claim: the user's grant if they hold one ("already"; "granted"
-- again for the very claim that made it, sent again); else, while the
-- sub-pool grants (open, within its window), an amount popped from the
-- stock and recorded as the user's held grant with serial and a deadline
-- (now + hold, by the shard's clock), appended to the outbox; the stock
-- empty: "empty", or with a spill token a reservation (token, now) and
-- "reserved", or "busy" while another reservation of the user is younger
-- than T.
--
-- A held grant past its deadline is released here, as the reaper would
-- release it (release_held: its amount back to the stock, the record marked
-- released, a release entry in the outbox), before any claim of the batch is
-- decided: no answer shows a hold that has run out, the user may grab again,
-- and the amount released is stock for every claim of the batch (no false
-- "empty"). Not when the claim that made the grant is in the batch (sent
-- again): it answers "granted" as its first run did, and every other claim
-- of its user "already"; the reaper releases the hold.
--
-- Re-sent (a reply lost on the wire), every claim answers as its first run
-- did: the grant made under a claim's serial is "granted" again, the
-- reservation made under its token "reserved" again; but a claim that comes
-- again only after its grant was released at its deadline is refused with
-- an error, unwritten (a new grant would reuse its serial).
--
-- The fence: a claim answered with a grant made before this run (sent
-- again, or "already") writes nothing of its own, and WAIT counts the
-- replicas that have the client's offset, which later versions of Redis
-- move only on a command that propagated (7.0 moves it on every command). With
-- ARGV[2] = "1" such a run moves a counter of the meta (resent), so the
-- WAIT after it covers every write before it, the grant's first among
-- them: no grant is answered as replicated that a failover could still
-- lose.
--
-- Returns one reply per claim, in order:
--   {"granted", amount, serial, deadline_ms} | {"already", amount, serial, deadline_ms}
--   | {"empty"} | {"reserved"} | {"busy"} | {"not_started", ms_left} | {"ended"} | {"closed"}
-- or a bad grant record's error as {"error", message}.
local meta, grants, reserve = KEYS[1], KEYS[3], KEYS[6]
local k = {meta = meta, stock = KEYS[2], grants = grants, deadlines = KEYS[4], outbox = KEYS[5], batches = KEYS[7]}
local validity = tonumber(ARGV[1])
local fence = ARGV[2] == '1'
local form = string.match(ARGV[3], '^%a+')
k.packed = form == 'packed' or form == 'batch'
k.grouped = form == 'batch'
k.batched = string.find(ARGV[3], ' batched', 1, true) ~= nil
local n = (#ARGV - 3) / 3
local out = {}

local m = redis.call('HMGET', meta, 'state', 'hold_ms', 'starts_ms', 'ends_ms', 'pool', 'index', 'ended')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
k.pool, k.index = m[5], m[6]
local shut -- the answer of every claim without a grant when the sub-pool does not grant now
if m[1] == 'closing' then
  shut = {'ended'} -- sealed by a close (seal.lua): it has ended
elseif m[1] ~= 'open' then
  shut = {'closed'}
else
  local starts, ends = tonumber(m[3]), tonumber(m[4])
  if m[7] == '1' or (ends > 0 and now >= ends) then
    -- Ended is a fact once seen: a clock that goes back (a failover to a
    -- host behind, a step of NTP) never opens the window again.
    shut = {'ended'}
    if m[7] ~= '1' then
      redis.call('HSET', meta, 'ended', '1')
    end
  elseif starts > 0 and now < starts then
    shut = {'not_started', starts - now}
  end
end

-- First pass: what every claim's user holds already, and which claims need
-- stock. A user may come twice in one batch: the first claim decides, the
-- second then finds that grant, as it would one batch later.
local users = {}
for i = 1, n do
  users[i] = ARGV[3 * i + 1]
end
local held = redis.call('HMGET', grants, unpack(users))
local made = {} -- user -> grant record made in this batch
local deadline = string.format('%d', now + (tonumber(m[2]) or 0))
local earlier = false -- a claim was answered with a grant made before this run (see the fence)

-- Expired holds first: each user's first claim in the batch releases the
-- user's hold that ran out (not the claim that made it, sent again), before
-- any stock is popped, so that an amount released here is offered to every
-- claim of the batch, those before its user's included. A claim that popped
-- before a later release would answer "empty" beside a packet in the stock.
local expiredAt = {} -- user -> the claim whose user's hold ran out: released here, for it
-- A hold the batch's own claim made (the batch sent again) is not released
-- here, even for another claim of its user in the batch: that claim is
-- answered its grant, as in the first run, never a grant released beside
-- it; the reaper releases it.
local resent = {} -- user -> a claim of the batch made the user's hold
local heldSerial = {} -- claim -> the serial of the grant its user holds
for i = 1, n do
  if held[i] then
    heldSerial[i] = string.match(held[i], '^%a:%d+:(%d+):%d+$')
    if heldSerial[i] == ARGV[3 * i + 2] then
      resent[users[i]] = true
    end
  end
end
for i = 1, n do
  local user = users[i]
  if heldSerial[i] and expiredAt[user] == nil and not resent[user] and release_held(k, user, held[i], now) then
    expiredAt[user] = i
  end
end

for i = 1, n do
  local user, serial, token = users[i], ARGV[3 * i + 2], ARGV[3 * i + 3]
  local g = made[user]
  if g == nil and (expiredAt[user] == nil or i < expiredAt[user]) then
    g = held[i] -- from expiredAt[user] on, released above: decided below as a new grab
  end
  local answer
  if user == '' or string.find(user, ' ', 1, true) then
    -- The deadline index separates users with spaces (prelude.lua): an id
    -- is never empty and holds none (rain.ValidID), and a claim of one
    -- that does is refused unwritten.
    answer = {'error', 'RAINSTATE an empty user id, or one with a space'}
  elseif g then
    local st, amount, ser, dl = string.match(g, '^(%a):(%d+):(%d+):(%d+)$')
    if st == nil then
      answer = {'error', 'RAINSTATE bad grant record for ' .. user}
    elseif st == 'r' and ser == serial then
      -- This very claim, sent again after its grant was released at its
      -- deadline (a reply lost, a retry later than the hold): a new grant
      -- would reuse the serial. Refused unwritten; a new claim may grab.
      answer = {'error', 'RAINSTATE the grant of serial ' .. serial .. ' was released before its claim came again'}
    elseif st ~= 'r' then
      if ser == serial then
        answer = {'granted', tonumber(amount), tonumber(ser), tonumber(dl)}
      else
        answer = {'already', tonumber(amount), tonumber(ser), tonumber(dl)}
      end
      earlier = true
    end
  end
  if answer == nil and shut then
    answer = shut
  end
  if answer == nil and token ~= '' then
    -- A reservation younger than T: this user's spill is in flight.
    local r = redis.call('HGET', reserve, user)
    if r then
      local rtoken, ts = string.match(r, '^(.+):(%d+)$')
      if rtoken == token then
        answer = {'reserved'} -- this very claim, sent again
      elseif ts and now - tonumber(ts) < validity then
        answer = {'busy'}
      else
        redis.call('HDEL', reserve, user) -- older than T: it can no longer be adopted
      end
    end
  end
  if answer == nil then
    -- The first claim to need stock pops what the rest of the batch may
    -- take in one call; write_books puts back what no claim took, in order.
    local amount, rec = pop_to_held(k, user, serial, deadline, n - i + 1)
    if amount == nil then
      if token == '' then
        answer = {'empty'}
      else
        redis.call('HSET', reserve, user, token .. ':' .. now)
        answer = {'reserved'}
      end
    else
      made[user] = rec
      answer = {'granted', tonumber(amount), tonumber(serial), tonumber(deadline)}
    end
  end
  out[i] = answer
end

if fence and earlier then
  redis.call('HINCRBY', meta, 'resent', 1)
end
write_books(k)
return out
