-- audit: the counters of one sub-pool and what can be checked against them
-- at once, atomically, in time that does not grow with the sub-pool.
--
-- KEYS[1] meta  KEYS[2] stock  KEYS[3] deadlines  KEYS[4] transfers  KEYS[5] batches
--
-- The recounts of the stock list and of the grants, resolved transfers and
-- verdicts hashes are read after this, in bounded pages (AuditSubPool), so
-- an audit never blocks a shard for long; they are trusted only when the
-- meta version, which every money move bumps, is the same before and after
-- them.
--
-- Returns field/value pairs (a flat array), {"found", 0} when the sub-pool
-- does not exist: the state, the meta counters and version under their own
-- names, list_len (LLEN of the stock), deadline_entries (the users the
-- deadline index names: the members of deadlines, one user each, and the
-- meta's batched_users, those named in batches), the
-- transfers in flight recounted (transfers, transfers_cents; a few at any
-- time) and as HGETALL returns them ("transfers_list"), and bad_records.
local meta, stock, deadlines, transfers = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local names = {'count', 'cents', 'stock_count', 'stock_cents', 'held_count', 'held_cents',
  'confirmed_count', 'confirmed_cents', 'released_count', 'released_cents',
  'received_count', 'received_cents', 'sent_count', 'sent_cents', 'inflight_count', 'inflight_cents',
  'version'}
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
put('list_len', redis.call('LLEN', stock))
put('deadline_entries', redis.call('ZCARD', deadlines) + (tonumber(redis.call('HGET', meta, 'batched_users')) or 0))
local tr = redis.call('HGETALL', transfers)
local tn, tsum, bad = 0, 0, 0
for i = 2, #tr, 2 do
  local amount = string.match(tr[i], '^(%d+):%d+:%d+:')
  if amount then
    tn, tsum = tn + 1, tsum + tonumber(amount)
  else
    bad = bad + 1
  end
end
put('transfers', tn)
put('transfers_cents', tsum)
put('bad_records', bad)
put('transfers_list', tr)
return out
