-- record: write a pool's record unless one is there, atomically; read it back.
--
-- KEYS[1] rain:{P}:pool   (hash: spec, seed, placement, state)
-- ARGV[1] spec   ARGV[2] seed   ARGV[3] placement   ARGV[4] state
--
-- Two preloads of one pool id racing on the same shard end with one record,
-- whole: the first one's. Re-sent, it changes nothing.
-- Returns the stored record as HGETALL does.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'seed', ARGV[2], 'placement', ARGV[3], 'state', ARGV[4])
end
return redis.call('HGETALL', KEYS[1])
