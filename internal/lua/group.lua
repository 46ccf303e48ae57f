-- group: settlement's consumer group on a sub-pool's outbox, created unless
-- the sub-pool is closed.
--
-- KEYS[1] meta     rain:{P:j}:meta
-- KEYS[2] outbox   rain:{P:j}:outbox
-- ARGV[1] the consumer group
--
-- XGROUP CREATE ... MKSTREAM would make the outbox of a closed sub-pool
-- again (a settle worker that has not yet heard of the close); this reads
-- the meta first and creates nothing for a sub-pool that is closed (its
-- tombstone) or was never set up.
-- Returns {"created"} | {"exists"} | {"gone"}
local meta, outbox = KEYS[1], KEYS[2]
local st = redis.call('HGET', meta, 'state')
if not st or st == 'closed' then
  return {'gone'}
end
local ok = redis.pcall('XGROUP', 'CREATE', outbox, ARGV[1], '0', 'MKSTREAM')
if type(ok) == 'table' and ok.err then
  if string.sub(ok.err, 1, 9) == 'BUSYGROUP' then
    return {'exists'}
  end
  return redis.error_reply(ok.err)
end
return {'created'}
