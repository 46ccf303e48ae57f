-- record: write a pool's record where it is missing, or move it on along
-- the pool's life; never back.
--
-- KEYS[1] rain:{P}:pool   (hash: spec, seed, placement, state, account)
-- ARGV[1] spec   ARGV[2] seed   ARGV[3] placement   ARGV[4] state
-- ARGV[5] account (JSON, "" for none)
-- ARGV[6] tags: the sub-pools' hash tag salts, comma-separated ("" for none;
--         see rain.SubPool.Tag), part of which pool the record is
--
-- A record without its spec (none, or a part written by an older version)
-- is written whole. A record of the same pool (the same spec, seed and
-- placement) whose state comes earlier in the pool's life (loading, open,
-- closing, closed) than ARGV[4] takes the new state, and the account when
-- one is given (one at the same stage that lacks its account takes it);
-- one further along is left as it is, so a stalled
-- preload can never open a pool that was closed, and a copy written back
-- from another shard keeps the furthest stage and its account. A record of
-- another spec is left as it is: the first preload of an id wins.
-- Re-sent, it changes nothing. Returns the stored record as HGETALL does,
-- then 1 when this call wrote the record or moved it on to ARGV[4] (of
-- concurrent calls, one), else 0.
local key = KEYS[1]
local moved = 0
local stage = {loading = 1, open = 2, closing = 3, closed = 4}
local cur = redis.call('HMGET', key, 'spec', 'seed', 'placement', 'state', 'tags')
if not cur[1] then
  moved = 1
  redis.call('DEL', key)
  redis.call('HSET', key, 'spec', ARGV[1], 'seed', ARGV[2], 'placement', ARGV[3], 'state', ARGV[4])
  if ARGV[5] ~= '' then
    redis.call('HSET', key, 'account', ARGV[5])
  end
  if ARGV[6] ~= '' then
    redis.call('HSET', key, 'tags', ARGV[6])
  end
elseif cur[1] == ARGV[1] and cur[2] == ARGV[2] and cur[3] == ARGV[3] and (cur[5] or '') == ARGV[6] then
  local from, to = stage[cur[4]] or 0, stage[ARGV[4]] or 0
  if to > from then
    moved = 1
    redis.call('HSET', key, 'state', ARGV[4])
  end
  if to >= from and ARGV[5] ~= '' and redis.call('HEXISTS', key, 'account') == 0 then
    redis.call('HSET', key, 'account', ARGV[5])
  end
  if to > from and ARGV[5] ~= '' then
    redis.call('HSET', key, 'account', ARGV[5])
  end
end
local all = redis.call('HGETALL', key)
all[#all + 1] = moved
return all
