package grab

import (
	"sync"
	"sync/atomic"
	"time"
)

// breaker is one shard's circuit breaker. A shard that fails a call (a
// timeout, a connection refused or reset: the network's answers, not a
// script's) trips it open: for cooldown every claim for the shard is
// answered at once, without work, so its users get a fast 503 and nothing
// waits on it. Then one claim goes through as a probe (half-open): if its
// call succeeds the breaker closes, if it fails it opens again. The breaker
// heals by itself once the shard answers again.
type breaker struct {
	cooldown time.Duration
	now      func() time.Time // time.Now; tests set a fake clock

	mu       sync.Mutex // guards the fields below
	state    breakerState
	openedAt time.Time

	trips atomic.Int64 // times it opened, ever
}

// breakerState is a breaker's state; its value is the metric's.
type breakerState int

const (
	breakerClosed   breakerState = iota // calls go through
	breakerOpen                         // calls are refused at once
	breakerHalfOpen                     // one probe call is in flight
)

func (s breakerState) String() string {
	return [...]string{"closed", "open", "half_open"}[s]
}

func newBreaker(cooldown time.Duration) *breaker {
	return &breaker{cooldown: cooldown, now: time.Now}
}

// allow reports whether a call may go to the shard now. An open breaker
// whose cooldown has passed lets exactly one caller through as the probe.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case breakerClosed:
		return true
	case breakerOpen:
		if b.now().Sub(b.openedAt) >= b.cooldown {
			b.state = breakerHalfOpen
			return true
		}
	}
	return false
}

// done records the outcome of a call that allow let through: failed means
// the shard did not answer (network error or timeout).
func (b *breaker) done(failed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case failed && b.state != breakerOpen:
		b.state, b.openedAt = breakerOpen, b.now()
		b.trips.Add(1)
	case !failed:
		b.state = breakerClosed
	}
}

// current is the state, for readiness and metrics.
func (b *breaker) current() breakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// ShardStats is one shard's claim path, for metrics.
type ShardStats struct {
	Name string
	// Breaker is the breaker's state: 0 closed, 1 open, 2 half-open.
	Breaker int
	// Trips counts the times the breaker opened.
	Trips int64
	// Failures counts batches the shard did not answer (network error or
	// timeout).
	Failures int64
	// Refused counts claims answered at once because the breaker was open;
	// Busy those refused by the bulkhead while the shard was late.
	Refused, Busy int64
	// InFlight is the claims queued or in flight (counted only when the
	// bulkhead is on).
	InFlight int64
}

// ShardStats returns each shard's claim path figures, in shard name order.
func (s *Service) ShardStats() []ShardStats {
	names := s.shards.Names()
	out := make([]ShardStats, len(names))
	for i, name := range names {
		b := s.batchers[name]
		out[i] = ShardStats{Name: name, Breaker: int(b.br.current()), Trips: b.br.trips.Load(),
			Failures: b.failures.Load(), Refused: b.refused.Load(), Busy: b.busy.Load(), InFlight: b.inflight.Load()}
	}
	return out
}
