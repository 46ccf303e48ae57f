-- audit: read one sub-pool whole, atomically, for the conservation check.
--
-- KEYS[1] meta  KEYS[2] stock  KEYS[3] grants  KEYS[4] deadlines  KEYS[5] transfers
--
-- It recounts the stock list and the grants hash and returns them beside the
-- meta counters; the caller compares. Cost is linear in the sub-pool's size
-- and the shard is blocked meanwhile (about 0.1 s per 100k packets), so it is
-- an operator's tool, not something to poll.
-- Returns {found, state, count, cents,
--          stock_count, stock_cents, list_len, list_sum,
--          held_count, held_cents, grants_held, grants_held_cents,
--          confirmed_count, confirmed_cents, grants_confirmed, grants_confirmed_cents,
--          released_count, released_cents, grants_released, deadlines, duplicate_serials,
--          bad_records, received_count, received_cents, sent_count, sent_cents,
--          inflight_count, inflight_cents, transfers, transfers_cents}
-- with found 0 (and nothing else meaningful) when the sub-pool does not exist.
local meta, stock, grants, deadlines, transfers = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local m = redis.call('HMGET', meta, 'state', 'count', 'cents', 'stock_count', 'stock_cents',
  'held_count', 'held_cents', 'confirmed_count', 'confirmed_cents', 'released_count', 'released_cents',
  'received_count', 'received_cents', 'sent_count', 'sent_cents', 'inflight_count', 'inflight_cents')
if m[1] == false then
  return {0}
end
local list_sum = 0
local items = redis.call('LRANGE', stock, 0, -1)
for i = 1, #items do
  list_sum = list_sum + tonumber(items[i])
end
local n = {h = 0, c = 0, r = 0}
local sum = {h = 0, c = 0, r = 0}
local serials, dups, bad = {}, 0, 0
local all = redis.call('HGETALL', grants)
for i = 2, #all, 2 do
  local st, amount, ser = string.match(all[i], '^(%a):(%d+):(%d+):%d+')
  if st == nil or n[st] == nil then
    bad = bad + 1
  else
    n[st] = n[st] + 1
    sum[st] = sum[st] + tonumber(amount)
    if serials[ser] then dups = dups + 1 end
    serials[ser] = true
  end
end
local tn, tsum = 0, 0
local ts = redis.call('HGETALL', transfers)
for i = 2, #ts, 2 do
  tn = tn + 1
  tsum = tsum + tonumber(string.match(ts[i], '^(%d+):') or 0)
end
local function num(x) return tonumber(x) or 0 end
return {1, m[1], num(m[2]), num(m[3]),
  num(m[4]), num(m[5]), #items, list_sum,
  num(m[6]), num(m[7]), n.h, sum.h,
  num(m[8]), num(m[9]), n.c, sum.c,
  num(m[10]), num(m[11]), n.r, redis.call('ZCARD', deadlines), dups, bad,
  num(m[12]), num(m[13]), num(m[14]), num(m[15]), num(m[16]), num(m[17]), tn, tsum}
