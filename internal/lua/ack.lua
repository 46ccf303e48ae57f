-- ack: the last step of a spill, at sibling j, resolves its transfer by the
-- home's verdict. ack: the home adopted the transfer; it is now sent.
-- untake: the home refused it: put the amount back in the stock.
-- The protocol: docs/architecture.md#the-spill-protocol.
--
-- KEYS[1] meta       rain:{P:j}:meta
-- KEYS[2] stock      rain:{P:j}:stock
-- KEYS[3] transfers  rain:{P:j}:transfers  (in flight)
-- KEYS[4] resolved   rain:{P:j}:settled    (token -> "a|u:amount:home:ms:user";
--                                            the key keeps its earlier name)
-- ARGV[1] token   ARGV[2] "ack" or "untake"
--
-- The transfer moves to the resolved hash, marked a (acked) or u (untaken):
-- the moves send_transfer and return_transfer (prelude.lua).
-- Both steps are idempotent: re-sent, each answers as the first run did. The
-- caller acts on the home's verdict only, so an ack of an untaken transfer,
-- or the other way round, means a bug or a shard that lost writes: it
-- changes nothing and answers "conflict".
-- Returns {"acked"} | {"returned"} | {"gone"} (no such transfer) | {"conflict"}
local transfers, resolved = KEYS[3], KEYS[4]
local k = {meta = KEYS[1], stock = KEYS[2], transfers = transfers, resolved = resolved}
local token, op = ARGV[1], ARGV[2]
local t = redis.call('HGET', transfers, token)
if not t then
  local s = redis.call('HGET', resolved, token)
  if not s then
    return {'gone'}
  end
  local st = string.sub(s, 1, 1)
  if (st == 'a') == (op == 'ack') then
    return {st == 'a' and 'acked' or 'returned'}
  end
  return {'conflict'}
end
if op == 'ack' then
  send_transfer(k, token, t)
  write_books(k)
  return {'acked'}
end
return_transfer(k, token, t)
write_books(k)
return {'returned'}
