-- audit: read one sub-pool whole, atomically, for the conservation check.
--
-- KEYS[1] meta  KEYS[2] stock  KEYS[3] grants  KEYS[4] deadlines
-- KEYS[5] transfers  KEYS[6] settled  KEYS[7] verdicts
--
-- It recounts the stock list, the grants hash and the spill records and
-- returns them beside the meta counters; the caller compares. Cost is linear
-- in the sub-pool's size and the shard is blocked meanwhile (about 0.1 s per
-- 100k packets), so it is an operator's tool, not something to poll.
--
-- Returns field/value pairs (a flat array), {"found", 0} when the sub-pool
-- does not exist. Numbers: the meta counters under their own names, and the
-- recounts: list_len, list_sum, grants_{held,confirmed,released}[_cents],
-- deadline_entries, duplicate_serials, bad_records, transfers[_cents] (in
-- flight), acked[_cents], untaken[_cents], adopted[_cents]. Arrays, as
-- HGETALL returns them, for matching spills across sub-pools:
-- "transfers_list", "settled_list", "verdicts_list".
local meta, stock, grants, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local transfers, settled, verdicts = KEYS[5], KEYS[6], KEYS[7]
local names = {'count', 'cents', 'stock_count', 'stock_cents', 'held_count', 'held_cents',
  'confirmed_count', 'confirmed_cents', 'released_count', 'released_cents',
  'received_count', 'received_cents', 'sent_count', 'sent_cents', 'inflight_count', 'inflight_cents'}
local state = redis.call('HGET', meta, 'state')
if state == false then
  return {'found', 0}
end
local out = {'found', 1, 'state', state}
local m = redis.call('HMGET', meta, unpack(names))
for i = 1, #names do
  table.insert(out, names[i])
  table.insert(out, tonumber(m[i]) or 0)
end
local function put(name, value)
  table.insert(out, name)
  table.insert(out, value)
end

local list_sum = 0
local items = redis.call('LRANGE', stock, 0, -1)
for i = 1, #items do
  list_sum = list_sum + tonumber(items[i])
end
put('list_len', #items)
put('list_sum', list_sum)

local n = {h = 0, c = 0, r = 0}
local sum = {h = 0, c = 0, r = 0}
local serials, dups, bad = {}, 0, 0
local all = redis.call('HGETALL', grants)
for i = 2, #all, 2 do
  local st, amount, ser = string.match(all[i], '^(%a):(%d+):(%d+):%d+$')
  if st == nil or n[st] == nil then
    bad = bad + 1
  else
    n[st] = n[st] + 1
    sum[st] = sum[st] + tonumber(amount)
    if serials[ser] then dups = dups + 1 end
    serials[ser] = true
  end
end
put('grants_held', n.h)
put('grants_held_cents', sum.h)
put('grants_confirmed', n.c)
put('grants_confirmed_cents', sum.c)
put('grants_released', n.r)
put('grants_released_cents', sum.r)
put('deadline_entries', redis.call('ZCARD', deadlines))
put('duplicate_serials', dups)

-- Spill records: in flight here, settled here, decided here as a home.
-- tally reads a hash and adds its records up by class: classify returns a
-- class and an amount, '' for a record that counts nowhere, or nil for one
-- that does not parse.
local function tally(key, classify)
  local n, sum = {}, {}
  local all = redis.call('HGETALL', key)
  for i = 2, #all, 2 do
    local class, amount = classify(all[i])
    if class == nil then
      bad = bad + 1
    elseif class ~= '' then
      n[class] = (n[class] or 0) + 1
      sum[class] = (sum[class] or 0) + tonumber(amount)
    end
  end
  return n, sum, all
end
local tn, tsum, tr = tally(transfers, function(v)
  local amount = string.match(v, '^(%d+):%d+:%d+:')
  return amount and 't', amount
end)
local sn, ssum, se = tally(settled, function(v)
  local st, amount = string.match(v, '^([au]):(%d+):%d+:%d+:')
  return st, amount
end)
local vn, vsum, ve = tally(verdicts, function(v)
  local amount = string.match(v, '^a:%d+:(%d+):%d+:')
  if amount then return 'a', amount end
  if string.sub(v, 1, 2) == 'r:' then return '' end
  return nil
end)
put('transfers', tn.t or 0)
put('transfers_cents', tsum.t or 0)
put('acked', sn.a or 0)
put('acked_cents', ssum.a or 0)
put('untaken', sn.u or 0)
put('untaken_cents', ssum.u or 0)
put('adopted', vn.a or 0)
put('adopted_cents', vsum.a or 0)
put('bad_records', bad)
put('transfers_list', tr)
put('settled_list', se)
put('verdicts_list', ve)
return out
