-- serial: reserve the next segment of grant serials (internal/idgen).
--
-- KEYS[1] the serial counter   rain:serial   (on the serial shard)
-- ARGV[1] n, the segment size   ARGV[2] floor: the highest serial any
--         watermark copy on the other shards has seen (0 if none)
--
-- end = max(counter, floor) + n; the caller owns (end - n, end]. The floor
-- carries the counter past every segment handed out before this shard lost
-- writes (an AOF tail lost with its host, an older backup restored), so no
-- serial is handed out twice. Re-sent, it reserves another segment: a gap,
-- which serials allow.
-- Returns end.
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[2])
if floor > cur then
  cur = floor
end
local e = cur + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%d', e))
return e
