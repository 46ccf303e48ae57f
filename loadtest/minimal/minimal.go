// Package minimal is the minimal design rain is measured against: one
// Redis, and per grab one script that answers the user's amount if they
// hold one, else pops an amount from the pool's stock and records it. It
// has no serials, holds, expiry, sub-pools or outbox: that is rain's extra
// work per grab, and the point of the comparison. loadtest/baseline serves
// it over HTTP for scripts/bench.sh; the claim path's benchmarks
// (internal/lua, internal/grab) run it beside rain's claims. Not for
// production.
package minimal

import (
	"context"
	"fmt"
	"iter"

	"github.com/redis/go-redis/v9"
)

// ClaimSrc is the whole grab in one round trip.
//
// KEYS[1] bl:{pool}:stock  list of amounts in cents
// KEYS[2] bl:{pool}:grants hash user_id -> amount
// KEYS[3] bl:{pool}:meta   set by Stock; tells "sold out" from "no such pool"
// ARGV[1] user_id
// Returns {code, amount}: code 2 granted, 1 already granted, 0 sold out, -1 no such pool.
const ClaimSrc = `
local g = redis.call('HGET', KEYS[2], ARGV[1])
if g then return {1, tonumber(g)} end
local a = redis.call('LPOP', KEYS[1])
if not a then
  if redis.call('EXISTS', KEYS[3]) == 0 then return {-1, 0} end
  return {0, 0}
end
redis.call('HSET', KEYS[2], ARGV[1], a)
return {2, tonumber(a)}
`

// Keys returns the stock, grants and meta keys of a pool, under one hash
// tag: ClaimSrc's KEYS.
func Keys(pool string) []string {
	return []string{"bl:{" + pool + "}:stock", "bl:{" + pool + "}:grants", "bl:{" + pool + "}:meta"}
}

// pushBatch is how many amounts one RPUSH carries; pushPipe is how many
// RPUSHes go out in one pipelined round trip.
const (
	pushBatch = 1000
	pushPipe  = 50
)

// Stock appends amounts to the stock of the pool whose Keys are k, on c:
// its meta key set to meta first unless it is set already (ClaimSrc then
// answers an empty stock "sold out"), then RPUSHes of pushBatch amounts,
// pushPipe of them to a round trip.
func Stock(ctx context.Context, c redis.Cmdable, k []string, meta int64, amounts iter.Seq[int64]) error {
	pipe := c.Pipeline()
	pipe.SetNX(ctx, k[2], meta, 0)
	batch := make([]any, 0, pushBatch)
	for a := range amounts {
		batch = append(batch, a)
		if len(batch) < pushBatch {
			continue
		}
		pipe.RPush(ctx, k[0], batch...)
		batch = make([]any, 0, pushBatch)
		if pipe.Len() >= pushPipe {
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("rpush %s: %w", k[0], err)
			}
		}
	}
	if len(batch) > 0 {
		pipe.RPush(ctx, k[0], batch...)
	}
	if _, err := pipe.Exec(ctx); err != nil { // the rest (an empty pipeline sends nothing)
		return fmt.Errorf("rpush %s: %w", k[0], err)
	}
	return nil
}

// Same is n amounts of cents each, for Stock.
func Same(n, cents int64) iter.Seq[int64] {
	return func(yield func(int64) bool) {
		for range n {
			if !yield(cents) {
				return
			}
		}
	}
}
