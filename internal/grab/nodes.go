package grab

// This file is the claim path on a shard that is a Redis Cluster: a
// batcher (lane, breaker, bulkhead) per primary, made when a claim first
// goes there, so one slow or dead primary costs only its own users
// (invariant 8, per primary); and the client a spill's step runs on.

import (
	"context"
	"sync"
	"time"

	"rain/internal/lua"
)

// nodeLanes is a cluster shard's batchers, by primary address.
type nodeLanes struct {
	mu     sync.Mutex // guards byAddr
	byAddr map[string]*batcher
}

// batcherFor is the batcher of sub-pool j: its shard's, or, on a cluster
// shard, that of the primary that owns the sub-pool's slot now (from the
// cluster client's slot map: a sub-pool whose slot moved is served where
// it went).
func (s *Service) batcherFor(ctx context.Context, p *poolView, j int) (*batcher, error) {
	if b := p.batchers[j]; b != nil {
		return b, nil
	}
	name := p.rec.Placement[j]
	addr, err := s.shards.Owner(ctx, name, p.keys[j].Meta)
	if err != nil {
		return nil, err
	}
	b := s.nodeBatcher(name, addr)
	if b.br.current() != breakerClosed {
		// The primary failed a batch: it may have failed over, and its
		// slots gone to a replica the slot map does not name yet. Have
		// the map read again (in the background, one read at a time), so
		// that the claims after this one go to the new primary.
		s.shards.Reload(ctx, name)
	}
	return b, nil
}

// nodeBatcher is the batcher of the primary at addr of cluster shard name,
// made and started on first use.
func (s *Service) nodeBatcher(name, addr string) *batcher {
	nl := s.nodes[name]
	nl.mu.Lock()
	defer nl.mu.Unlock()
	if b := nl.byAddr[addr]; b != nil {
		return b
	}
	parts := int64(len(nl.byAddr) + 1)
	ctx, cancel := context.WithTimeout(s.stopCtx, s.shards.Timeout())
	if ps, err := s.shards.Primaries(ctx, name); err == nil { // learns which have replicas
		parts = int64(len(ps))
	}
	cancel()
	b := s.newBatcher(name+"/"+addr, name, s.shards.Node(name, addr), s.shards.NodeReplicated(name, addr), parts)
	nl.byAddr[addr] = b
	return b
}

// nodeBatchers lists every batcher made for the primaries of cluster
// shard name, by address.
func (s *Service) nodeBatchers(name string) map[string]*batcher {
	nl := s.nodes[name]
	nl.mu.Lock()
	defer nl.mu.Unlock()
	out := make(map[string]*batcher, len(nl.byAddr))
	for a, b := range nl.byAddr {
		out[a] = b
	}
	return out
}

// stepClient is where a spill's step on sub-pool j runs, and how long it
// waits for a replica after it on the same connection (0: none): see
// shard.Set.Writer.
func (s *Service) stepClient(ctx context.Context, p *poolView, j int) (lua.Pipeliner, time.Duration, error) {
	c, replicated, err := s.shards.Writer(ctx, p.rec.Placement[j], p.keys[j].Meta)
	if err != nil || !replicated {
		return c, 0, err
	}
	return c, s.shards.Timeout() / 2, nil
}

// usable reports whether sub-pool j's claims may go now: its batcher's
// breaker is closed (a spill skips a sibling whose primary is known bad).
func (s *Service) usable(ctx context.Context, p *poolView, j int) bool {
	b, err := s.batcherFor(ctx, p, j)
	return err == nil && b.br.current() == breakerClosed
}
