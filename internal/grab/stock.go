package grab

// This file is what the metrics read of the grab path: the stock of the
// pools this instance serves, and each shard's claim path.

import (
	"context"
	"maps"
	"sync"

	"github.com/redis/go-redis/v9"
)

// SubPoolStock is one sub-pool's stock, for metrics.
type SubPoolStock struct {
	Pool           string
	Index          int
	Shard          string
	RemainingCount int64
	RemainingCents int64
}

// Stock reads the stock of every sub-pool of the open pools this instance
// serves (one HMGET per sub-pool, pipelined per shard, the shards at once);
// a shard whose breaker is open is not asked, and one that does not answer
// within ctx leaves its sub-pools out. It is what a metrics scrape reads: a
// frozen shard costs the scrape ctx's bound at most, once (its breaker
// opens on the claims meanwhile).
func (s *Service) Stock(ctx context.Context) []SubPoolStock {
	s.mu.RLock()
	views := make(map[string]*poolView, len(s.pools))
	maps.Copy(views, s.pools)
	s.mu.RUnlock()
	type read struct {
		st  SubPoolStock
		cmd *redis.SliceCmd
	}
	pipes := map[*batcher]redis.Pipeliner{}
	var reads []read
	for id, p := range views {
		for j := range p.keys {
			b, err := s.batcherFor(ctx, p, j)
			if err != nil || b.br.current() != breakerClosed {
				continue
			}
			pipe := pipes[b]
			if pipe == nil {
				pipe = b.c.Pipeline()
				pipes[b] = pipe
			}
			cmd := pipe.HMGet(ctx, p.keys[j].Meta, "stock_count", "stock_cents")
			reads = append(reads, read{SubPoolStock{Pool: id, Index: j, Shard: p.rec.Placement[j]}, cmd})
		}
	}
	var wg sync.WaitGroup
	for _, pipe := range pipes {
		wg.Go(func() { _, _ = pipe.Exec(ctx) }) // errors are per command, read below
	}
	wg.Wait()
	var out []SubPoolStock
	for _, r := range reads {
		var n struct {
			Count int64 `redis:"stock_count"`
			Cents int64 `redis:"stock_cents"`
		}
		if r.cmd.Err() != nil || r.cmd.Scan(&n) != nil {
			continue
		}
		r.st.RemainingCount, r.st.RemainingCents = n.Count, n.Cents
		out = append(out, r.st)
	}
	return out
}
