package grab

// This file says whether this instance can serve: the state of each shard,
// and which shards the live pools depend on.

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"time"
)

// Shard states in a Readiness.
const (
	ShardUp          = "up"
	ShardSlow        = "slow"         // answers, but slower than a fifth of the call budget
	ShardDown        = "down"         // does not answer within the budget
	ShardBreakerOpen = "breaker_open" // failed a call lately: its users are answered 503 at once
	ShardUnknown     = "unknown"      // not reached, for a fault of this process (Readiness.Process says which)
)

// ShardState is one shard as readiness sees it.
type ShardState struct {
	Name      string  `json:"name"`
	State     string  `json:"state"`
	LatencyMS float64 `json:"latency_ms"`
	InUse     bool    `json:"in_use"` // a live pool has a sub-pool there
	Error     string  `json:"error,omitempty"`
}

// Readiness is GET /readyz's answer: Ready only when every shard answers
// (up, or slow) and this process can reach them (API.md). Each shard says
// whether a live pool depends on it, so an operator sees which users a
// shard that is down strands.
type Readiness struct {
	Ready bool `json:"ready"`
	// Process names a fault of this process, not of the shards, that keeps
	// it from reaching them: "out of file descriptors". Empty when none.
	Process string       `json:"process,omitempty"`
	Shards  []ShardState `json:"shards"`
}

// ProcessOutOfFDs is Readiness.Process when the process cannot open a
// connection for want of file descriptors.
const ProcessOutOfFDs = "out of file descriptors"

// outOfFDs reports whether err is the process's (or the system's) file
// descriptor limit: the fault is rain's, not the shard's.
func outOfFDs(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// Ready pings every shard at once, bounded by ctx and by the call budget,
// and reports each shard's state: any shard down, or whose breaker is
// open, makes the instance not ready, whether or not a live pool has a
// sub-pool there (a new pool may be placed on it, and the serial counter
// lives on one shard). A shard is in use when a pool of the
// registry (as it was last read) has a sub-pool there; when a pool cannot
// be resolved, or the pools were never listed, every shard counts as in use.
func (s *Service) Ready(ctx context.Context) Readiness {
	ctx, cancel := context.WithTimeout(ctx, s.shards.Timeout())
	defer cancel()
	names := s.shards.Names()
	out := Readiness{Ready: true, Shards: make([]ShardState, len(names))}
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			st := ShardState{Name: name, State: ShardUp}
			start := time.Now()
			err := s.shards.PingShard(ctx, name)
			st.LatencyMS = float64(time.Since(start).Microseconds()) / 1000
			switch {
			case err != nil && outOfFDs(err):
				st.State, st.Error = ShardUnknown, "not reached: this process is out of file descriptors ("+err.Error()+")"
			case err != nil:
				st.State, st.Error = ShardDown, err.Error()
			case s.breakerOpen(name):
				st.State = ShardBreakerOpen
			case time.Since(start) > s.shards.Timeout()/5:
				st.State = ShardSlow
			}
			out.Shards[i] = st
		})
	}
	inUse := s.shardsInUse(ctx)
	wg.Wait()
	for i := range out.Shards {
		st := &out.Shards[i]
		st.InUse = inUse == nil || inUse[st.Name]
		if st.State == ShardDown || st.State == ShardBreakerOpen {
			out.Ready = false
		}
		if st.State == ShardUnknown {
			out.Ready, out.Process = false, ProcessOutOfFDs
		}
	}
	return out
}

// breakerOpen reports whether a breaker of the named shard (a cluster
// shard's: any of its primaries') is not closed, and lets each such probe:
// the shard answered a PING, so it heals with no claims coming.
func (s *Service) breakerOpen(name string) bool {
	var bs []*batcher
	if b := s.batchers[name]; b != nil {
		bs = append(bs, b)
	} else {
		for _, b := range s.nodeBatchers(name) {
			bs = append(bs, b)
		}
	}
	open := false
	for _, b := range bs {
		if b.br.current() != breakerClosed {
			open = true
			b.br.poke()
		}
	}
	return open
}

// shardsInUse returns the shards the listed pools have sub-pools on; nil
// means every shard (the pools were never listed, or one cannot be read).
func (s *Service) shardsInUse(ctx context.Context) map[string]bool {
	ids := s.cat.LastList()
	if ids == nil {
		return nil
	}
	in := map[string]bool{}
	for _, id := range ids {
		p, err := s.cat.Cached(ctx, id)
		if err != nil {
			return nil
		}
		for _, name := range p.Placement {
			in[name] = true
		}
	}
	return in
}
