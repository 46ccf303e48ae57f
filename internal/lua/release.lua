-- release: return the amounts of expired grants to the stock (the reaper).
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] stock      rain:{P:j}:stock
-- KEYS[3] grants     rain:{P:j}:grants
-- KEYS[4] deadlines  rain:{P:j}:deadlines
-- KEYS[5] outbox     rain:{P:j}:outbox
-- KEYS[6] batches    rain:{P:j}:deadline_batches
--
-- Deadlines are read on the shard's clock (TIME). The deadline index is two
-- sorted sets (prelude.lua, the deadline index): deadlines, a member per
-- user, and batches, a member per batch naming its users. Each due member's
-- users are looked at in turn by release_due, and each one's grant is
-- released by release_held, only if it is still held and past its
-- deadline, checked there, atomically: a stale or concurrent reaper can
-- never release a grant twice, nor one that was confirmed, nor a later
-- grant of a user granted again. A released user may grab again. The
-- member then leaves the index: every grant it named is now released,
-- confirmed, gone, or named by a later member.
-- ARGV[1] bounds the users looked at: whole members are taken, the due
-- members of deadlines first, until that many users have been (a member
-- names at most a batch of claims), reading batches 8 members at a time.
-- Returns {released, released_cents, oldest_overdue_ms, more, next_ms, held}:
-- oldest_overdue_ms is how long past its deadline the oldest grant released
-- was (0 if none: a member naming only grants confirmed before their
-- deadline is no lag); more is 1 when the call stopped at its bound and more
-- may be due; next_ms is how long until a grant can next fall due: the
-- earliest deadline left, and at most the hold (a grant made later falls
-- due no sooner), so the reaper need not look before; held is how many
-- members the index still has (0: no grant is held here, and the reaper
-- has nothing to do until a grab marks the sub-pool again).
local meta, grants = KEYS[1], KEYS[3]
local k = {meta = meta, stock = KEYS[2], grants = grants, deadlines = KEYS[4], outbox = KEYS[5], batches = KEYS[6]}
local limit = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m = redis.call('HMGET', meta, 'pool', 'index', 'hold_ms')
k.pool, k.index = m[1], m[2]
local n, cents, seen, more, oldest = 0, 0, 0, 0, 0
for _, index in ipairs({k.deadlines, k.batches}) do
  -- A member of batches names up to a batch of users (8 KB of ids): it is
  -- read a few members at a time, not as many as users are left to look
  -- at. Each member read leaves the index, so the next read starts after.
  local page = limit
  if index == k.batches then
    page = 8
  end
  while seen < limit do
    local want = math.min(page, limit - seen)
    local due = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'WITHSCORES', 'LIMIT', 0, want)
    for i = 1, #due, 2 do
      if seen >= limit then
        break
      end
      local named, released, released_cents, earliest = release_due(k, index, due[i], now)
      seen, n, cents = seen + named, n + released, cents + released_cents
      if earliest then
        oldest = math.max(oldest, now - earliest)
      end
    end
    if #due / 2 < want then
      break -- nothing more is due here
    end
  end
  if more == 0 and seen >= limit and redis.call('ZCOUNT', index, '-inf', now) > 0 then
    more = 1
  end
end
write_books(k)
local nextms, held = tonumber(m[3]) or 0, 0
for _, index in ipairs({k.deadlines, k.batches}) do
  local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
  if #first > 0 then
    nextms = math.min(nextms, math.max(0, tonumber(first[2]) - now))
  end
  held = held + redis.call('ZCARD', index)
end
return {n, cents, oldest, more, nextms, held}
