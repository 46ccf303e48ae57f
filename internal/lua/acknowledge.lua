-- acknowledge: settlement is done with outbox entries: acknowledge them in
-- the consumer group and delete them from the stream, in one step.
--
-- KEYS[1] outbox   rain:{P:j}:outbox
-- ARGV[1] the consumer group   ARGV[2..] entry ids
--
-- One script, so that no crash leaves an entry acknowledged but still in the
-- stream: a close counts what the outbox holds (seal.lua), and such an
-- entry, never read again by the group, would keep the pool from closing.
-- Neither command creates the stream. Sent again, it changes nothing and
-- answers the same. Returns OK.
local ids = {}
for i = 2, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
redis.call('XDEL', KEYS[1], unpack(ids))
return redis.status_reply('OK')
