-- prelude: every move of a sub-pool's money, told once. lua.go puts this
-- file before every script when it loads them, so a script moves money only
-- by calling the functions below: no script writes a money counter, the
-- stock list, a grant, the deadline index, a transfer or the outbox itself
-- (TestMoneyMovesOnlyInThePrelude reads every script for it).
--
-- Where the money of a sub-pool is. Each place has two counters in the
-- meta hash, <place>_count and <place>_cents:
--   stock      the amounts in the stock list, not granted
--   held       grants held (grant record "h:amount:serial:deadline_ms")
--   confirmed  grants settlement confirmed ("c:..."): for good
--   inflight   amounts a spill took from here for another home, its
--              verdict not yet followed (the transfers hash)
-- and three tallies count what crossed a line:
--   released   held grants released at their deadline ("r:..."), their
--              amount back in the stock
--   received   grants made here of an amount taken from a sibling
--   sent       amounts taken from here and granted at their home
-- count and cents are what setup.lua says the sub-pool holds once loaded;
-- nothing moves them.
--
-- Conservation: once the sub-pool is open, after every script, in count
-- and in cents,
--
--     count + received - sent = stock + held + confirmed + inflight
--
-- because each move takes from one side what it gives to the other:
--
--   load_stock       preload    -> stock      load.lua (open.lua opens at
--                                             stock = count)
--   pop_to_held      stock      -> held       a claim: claim_many.lua
--   release_held     held       -> stock      + released, at the deadline:
--                                             release.lua, claim_many.lua
--   confirm_held     held       -> confirmed  confirm.lua, confirm_many.lua
--   pop_to_transfer  stock      -> inflight   a spill's take: take.lua
--   adopt_to_held    + received -> held       a spill's adopt: adopt.lua
--   send_transfer    inflight   -> + sent     the home adopted it: ack.lua
--   return_transfer  inflight   -> stock      the home refused it: ack.lua
--
-- Across a pool, each token's sent at its sibling is a received at its
-- home; the audit matches them (docs/architecture.md#the-audit).
--
-- The moves change the counters in this script's memory. write_books, the
-- last call of a script that moved money, writes them: one read and one
-- write of the meta, the version bumped once, however many moves the
-- script made (a batch of claims costs the counters of one), with the
-- records that wait for it (the grants made, and the stock popped for
-- claims that did not take it). Until then a script does not read its own
-- grants back.
--
-- A move takes the sub-pool's keys in a table k (meta, stock, grants,
-- deadlines, batches, outbox, transfers, resolved: those it needs), all of one
-- sub-pool and so of one hash tag, and for a grant's outbox entry in
-- fields and the stock's notice the pool id and sub-pool index (k.pool,
-- k.index; write_books reads them from the meta when they are not given).
--
-- Amounts are strings of digits as Redis and the callers give them; sums
-- are Lua numbers, exact to 2^53 (rain caps a pool at 1e15 cents), written
-- with %d: a number passed to redis.call as it is would be sent as %.14g.

-- A slot being moved (Redis Cluster, this node MIGRATING it): Redis runs a
-- script here only if every key it declares is here, but then refuses any
-- command of it that touches a key that is not (one the script itself
-- emptied, and so deleted, included) with an error, and keeps what the
-- script wrote before it: half a script. So every script first reads a key
-- of its slot that never exists, which on a migrating slot fails before
-- anything is written, and answers TRYAGAIN: nothing ran, try again (once
-- the keys are all gone, Redis sends the caller to the node they moved to).
-- Elsewhere (a slot of this node's, a slot it imports under ASKING, a
-- server that is no cluster) the read finds nothing and costs a call.
-- The key read is named rain:... as every key of rain's is, so that a
-- Redis user allowed rain's keys alone (~rain:*) may read it. A key with
-- braces but no hash tag (an empty {}, a } alone) is not rain's: no read.
if #KEYS > 0 then
  local key = KEYS[1]
  local open = string.find(key, '{', 1, true)
  local close = open and string.find(key, '}', open + 1, true)
  local tag -- the part of the key its slot is hashed from
  if close and close > open + 1 then
    tag = string.sub(key, open + 1, close - 1)
  elseif not string.find(key, '[{}]') then
    tag = key
  end
  if tag then
    local probe = redis.pcall('EXISTS', 'rain:{' .. tag .. '}:never')
    if type(probe) == 'table' and probe.err then
      if string.find(probe.err, 'non local key', 1, true) then
        return redis.error_reply('TRYAGAIN the slot of ' .. key .. ' is being moved: nothing ran (' .. probe.err .. ')')
      end
      return redis.error_reply(probe.err) -- nothing ran: not a slot moving (a key the user may not read, ...)
    end
  end
end

local books = {}  -- counter -> what this script's moves changed it by
local booked = {} -- those counters, in the order first changed
local popped, used = nil, 0 -- the stock pop_to_held popped, and how much of it it used
local grants_made = {} -- HSET arguments of the grants made
local due_users, due_order = {}, {} -- deadline -> users of the grants made that fall due then; those deadlines in order
local outbox_grants = {} -- the grants made for the script's one outbox entry (k.grouped)
local restocked = false -- an amount came back to the stock

-- change adds by to counter in this script's books.
local function change(counter, by)
  if books[counter] == nil then
    books[counter] = 0
    booked[#booked + 1] = counter
  end
  books[counter] = books[counter] + by
end

-- move books one amount from place from to place to (nil: from or to
-- outside the sub-pool's places).
local function move(from, to, amount)
  local cents = tonumber(amount)
  if from then
    change(from .. '_count', -1)
    change(from .. '_cents', -cents)
  end
  if to then
    change(to .. '_count', 1)
    change(to .. '_cents', cents)
  end
end

-- tally counts one amount across a line (released, received, sent).
local function tally(name, amount)
  change(name .. '_count', 1)
  change(name .. '_cents', tonumber(amount))
end

-- integer is s (a counter as HMGET reads it; false or nil: missing, 0) as
-- a number when it is an integer's digits, else nil.
local function integer(s)
  s = s or '0'
  return string.match(s, '^%-?%d+$') and tonumber(s)
end

-- The outbox: entries of the grants made (for settlement) and one per
-- grant released. Packed, an entry is one field, its sub-pool its stream's:
--   g  "amount:serial:deadline_ms:user"  a grant made
--   G  the same of each grant a script made, separated by spaces: the
--      grants of one batch in one entry (an id holds no space)
--   r  "amount:serial:deadline_ms:user"  a held grant released
-- The user comes last: an id may hold ':'. A grant's entry is packed only
-- when the script is told so (k.packed: claim_many's ARGV, rain serve
-- --outbox packed), and a batch's grants share one only when told that
-- (k.grouped: --outbox batch), since a rain settle before that form leaves
-- it pending for an operator; else it has a field per value (type grant,
-- pool, sub, user, amount, serial, deadline_ms, and origin for one a spill
-- adopted), the only form a rain settle before the packed one pays: it
-- acknowledges, unpaid, any entry whose type is not grant. That is right
-- for a release, which pays nothing, so releases are always packed.
-- lua.ParseOutboxEntries reads every form.

-- The deadline index names every held grant under its deadline, for the
-- reaper (release.lua), in two sorted sets of the same form: a member is
-- users separated by spaces (an id holds none), scored by the deadline of
-- their grants. A script's grants that fall due at the same time share one
-- member: one ZADD of a member per batch costs a fraction of a member per
-- grant (docs/benchmarks.md). A member of several users goes to
-- k.batches, and only when the script is told so (k.batched: claim_many's
-- ARGV, rain serve --deadline-index batch): a reaper before that key never
-- reads it, and never releases what it names. Else, and for a grant alone,
-- each user has a member in k.deadlines, the form and key every earlier
-- release writes and reads (such a reaper reads a member of k.deadlines as
-- one user id: it must never meet a member of several). A grant confirmed
-- or released before its deadline removes its user's member from
-- k.deadlines (ZREM user) and leaves a member of several users where it
-- is: the reaper, at a member's
-- deadline, releases those of its users whose grant is still held and
-- past its deadline (release_held checks both: a user granted again since
-- holds a later deadline) and then removes the member. So the index holds
-- a member while any grant it names is held, and at most until its
-- deadline after that. The meta's batched_users counts the users named in
-- k.batches (write_books adds, the reaper takes away), so that the audit
-- checks at once that the index names at least as many users as grants
-- are held.

-- hold records a new held grant: its record and deadline (written by
-- write_books) and its outbox entry, for settlement. origin: the sibling
-- its amount came from, nil when it came from this stock.
local function hold(k, user, amount, serial, deadline, origin)
  local rec = 'h:' .. amount .. ':' .. serial .. ':' .. deadline
  grants_made[#grants_made + 1] = user
  grants_made[#grants_made + 1] = rec
  local users = due_users[deadline]
  if users == nil then
    users = {}
    due_users[deadline] = users
    due_order[#due_order + 1] = deadline
  end
  users[#users + 1] = user
  if k.grouped and not origin then
    outbox_grants[#outbox_grants + 1] = amount .. ':' .. serial .. ':' .. deadline .. ':' .. user -- XADD by write_books
  elseif k.packed and not origin then
    redis.call('XADD', k.outbox, '*', 'g', amount .. ':' .. serial .. ':' .. deadline .. ':' .. user)
  elseif origin then
    redis.call('XADD', k.outbox, '*', 'type', 'grant', 'pool', k.pool, 'sub', k.index, 'user', user,
      'amount', amount, 'serial', serial, 'deadline_ms', deadline, 'origin', origin)
  else
    redis.call('XADD', k.outbox, '*', 'type', 'grant', 'pool', k.pool, 'sub', k.index, 'user', user,
      'amount', amount, 'serial', serial, 'deadline_ms', deadline)
  end
  return rec
end

-- The moves, and what scripts call.

-- zero_books: the counters a new sub-pool starts with, as HSET arguments
-- (setup.lua). The spill's (inflight, received, sent) start missing, which
-- every reader takes for 0.
local function zero_books()
  return {'stock_count', 0, 'stock_cents', 0, 'held_count', 0, 'held_cents', 0,
    'confirmed_count', 0, 'confirmed_cents', 0, 'released_count', 0, 'released_cents', 0}
end

-- load_stock: preload -> stock. Appends amounts[from..] to the stock.
local function load_stock(k, amounts, from)
  local sum = 0
  for i = from, #amounts do
    sum = sum + tonumber(amounts[i])
  end
  redis.call('RPUSH', k.stock, unpack(amounts, from))
  change('stock_count', #amounts - from + 1)
  change('stock_cents', sum)
end

-- pop_to_held: stock -> held. The next amount of the stock becomes user's
-- held grant with serial and deadline_ms, and its outbox entry. The first
-- call pops upto amounts at once (what the script's claims may still
-- take); write_books puts back those no claim took. Returns the amount and
-- the grant record, or nil when the stock is empty.
local function pop_to_held(k, user, serial, deadline, upto)
  if popped == nil then
    popped = redis.call('LPOP', k.stock, upto) or {}
  end
  used = used + 1
  local amount = popped[used]
  if amount == nil then
    return nil
  end
  local rec = hold(k, user, amount, serial, deadline, nil)
  move('stock', 'held', amount)
  return amount, rec
end

-- release_held: held -> stock, + released. user's grant record rec is
-- released only if it is still held and past its deadline (now, the
-- shard's clock), so no grant is released twice, nor one confirmed: the
-- amount goes back to the stock, the record is marked released, a
-- deadline index member of this user alone leaves the index (a shared one
-- stays until its deadline, see above) and a release entry goes to the
-- outbox. Returns the amount released and its deadline (a number), or nil.
local function release_held(k, user, rec, now)
  local st, amount, serial, deadline = string.match(rec, '^(%a):(%d+):(%d+):(%d+)$')
  if st ~= 'h' or tonumber(deadline) > now then
    return nil
  end
  redis.call('RPUSH', k.stock, amount)
  redis.call('HSET', k.grants, user, 'r' .. string.sub(rec, 2))
  redis.call('ZREM', k.deadlines, user)
  redis.call('XADD', k.outbox, '*', 'r', amount .. ':' .. serial .. ':' .. deadline .. ':' .. user)
  move('held', 'stock', amount)
  tally('released', amount)
  restocked = true
  return amount, tonumber(deadline)
end

-- release_due: the reaper's step on one due member of the deadline index
-- (index: k.deadlines or k.batches). Each user it names has the grant it
-- holds released by release_held, which checks that it is still held and
-- past its deadline (a user granted again since holds a later deadline,
-- named by a later member); then the member leaves the index. Returns how
-- many users it names, and the count, cents and earliest deadline (nil:
-- none) of the grants released.
local function release_due(k, index, member, now)
  local named, n, cents, earliest = 0, 0, 0, nil
  for user in string.gmatch(member, '[^ ]+') do
    named = named + 1
    local g = redis.call('HGET', k.grants, user)
    local amount, deadline
    if g then
      amount, deadline = release_held(k, user, g, now)
    end
    if amount then
      n, cents = n + 1, cents + tonumber(amount)
      if earliest == nil or deadline < earliest then
        earliest = deadline
      end
    end
  end
  if redis.call('ZREM', index, member) == 1 and index == k.batches then
    change('batched_users', -named)
  end
  return named, n, cents, earliest
end

-- confirm_held: held -> confirmed, for good: a confirmed grant is never
-- released. rec is user's grant record, neither confirmed nor released
-- (the caller answers those); a deadline index member of this user alone
-- leaves the index. Returns its amount.
local function confirm_held(k, user, rec)
  local amount = string.match(rec, '^%a:(%d+):')
  redis.call('HSET', k.grants, user, 'c' .. string.sub(rec, 2))
  redis.call('ZREM', k.deadlines, user)
  move('held', 'confirmed', amount)
  return amount
end

-- pop_to_transfer: stock -> inflight. The next amount of the stock becomes
-- a transfer in flight under token, for user at home, taken at now.
-- Returns the amount, or nil when the stock is empty.
local function pop_to_transfer(k, token, home, user, now)
  local amount = redis.call('LPOP', k.stock)
  if not amount then
    return nil
  end
  redis.call('HSET', k.transfers, token, amount .. ':' .. home .. ':' .. now .. ':' .. user)
  move('stock', 'inflight', amount)
  return amount
end

-- adopt_to_held: + received -> held. An amount taken from sibling origin
-- becomes user's held grant here, with its outbox entry. Returns the grant
-- record.
local function adopt_to_held(k, user, amount, serial, deadline, origin)
  local rec = hold(k, user, amount, serial, deadline, origin)
  tally('received', amount)
  move(nil, 'held', amount)
  return rec
end

-- send_transfer: inflight -> + sent. The transfer rec under token, which
-- its home adopted, is resolved as sent (marked a).
local function send_transfer(k, token, rec)
  local amount = string.match(rec, '^(%d+):')
  redis.call('HDEL', k.transfers, token)
  redis.call('HSET', k.resolved, token, 'a:' .. rec)
  move('inflight', nil, amount)
  tally('sent', amount)
end

-- return_transfer: inflight -> stock. The transfer rec under token, which
-- its home refused, is resolved as untaken (marked u), its amount back in
-- the stock.
local function return_transfer(k, token, rec)
  local amount = string.match(rec, '^(%d+):')
  redis.call('HDEL', k.transfers, token)
  redis.call('HSET', k.resolved, token, 'u:' .. rec)
  redis.call('RPUSH', k.stock, amount)
  move('inflight', 'stock', amount)
  restocked = true
end

-- write_books writes what this script's moves wait for: the stock popped
-- for claims that did not take it, back in order; the grants made; the
-- counters, and the version, which every money move bumps (the audit
-- trusts a recount only while the version holds); and, when an amount came
-- back to the stock, a notice to every instance (internal/events: this
-- sub-pool is no longer empty). Every script that moved money calls it
-- last; it writes nothing when nothing moved.
local function write_books(k)
  if popped ~= nil and used < #popped then
    local back = {}
    for i = #popped, used + 1, -1 do
      back[#back + 1] = popped[i]
    end
    redis.call('LPUSH', k.stock, unpack(back))
  end
  if #grants_made > 0 then
    redis.call('HSET', k.grants, unpack(grants_made))
    if #outbox_grants > 0 then
      redis.call('XADD', k.outbox, '*', 'G', table.concat(outbox_grants, ' '))
    end
    local alone, shared = {}, {} -- ZADD arguments of k.deadlines and k.batches
    for _, deadline in ipairs(due_order) do
      local users = due_users[deadline]
      if #users == 1 or not k.batched then
        for _, user in ipairs(users) do
          alone[#alone + 1] = deadline
          alone[#alone + 1] = user
        end
      else
        shared[#shared + 1] = deadline
        shared[#shared + 1] = table.concat(users, ' ')
      end
    end
    if #alone > 0 then
      redis.call('ZADD', k.deadlines, unpack(alone))
    end
    -- batched_users (a meta field) counts the users the members of
    -- k.batches name, for the audit's check that the index can name every
    -- grant held: a member made again (the same users, a later deadline;
    -- every grant its first run named is gone) is counted once.
    for i = 1, #shared, 2 do
      if redis.call('ZADD', k.batches, shared[i], shared[i + 1]) == 1 then
        change('batched_users', #due_users[shared[i]])
      end
    end
  end
  if #booked > 0 then
    -- One read and one write of the meta, however many counters moved.
    -- A sum is exact in a Lua number below 2^53; a counter beyond 2^52
    -- (a tally of many turnovers) or one that is not a number is left to
    -- HINCRBY, exact to 2^63 and an error on a bad value.
    local was = redis.call('HMGET', k.meta, 'version', unpack(booked))
    local set, exact = {}, {}
    local version = integer(was[1])
    if version and version < 2 ^ 52 then
      set[1], set[2] = 'version', string.format('%d', version + 1)
    else
      redis.call('HINCRBY', k.meta, 'version', 1)
    end
    for i, counter in ipairs(booked) do
      local v = integer(was[i + 1])
      if v and math.abs(v) < 2 ^ 52 and math.abs(books[counter]) < 2 ^ 52 then
        set[#set + 1] = counter
        set[#set + 1] = string.format('%d', v + books[counter])
      else
        exact[#exact + 1] = counter
      end
    end
    if #set > 0 then
      redis.call('HSET', k.meta, unpack(set))
    end
    for _, counter in ipairs(exact) do
      redis.call('HINCRBY', k.meta, counter, string.format('%d', books[counter]))
    end
  end
  if restocked then
    local pool, index = k.pool, k.index
    if pool == nil then
      local m = redis.call('HMGET', k.meta, 'pool', 'index')
      pool, index = m[1], m[2]
    end
    redis.call('PUBLISH', 'rain:events', 'stock ' .. pool .. ' ' .. index)
  end
end

-- (the script follows)
