package grab

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// breaker is one shard's circuit breaker. A shard that fails a call (a
// timeout, a connection refused or reset: the network's answers, not a
// script's) trips it open: every claim for the shard is answered at once,
// without work, so its users get a fast 503 and nothing waits on it. After
// cooldown the next claim (or readiness check) that comes turns it
// half-open and starts a probe in the background, a PING bounded by the shard's budget; the claims keep
// being answered at once meanwhile, so no user's claim ever waits on a
// shard known bad. If the probe is answered the breaker closes, if not it
// opens again for another cooldown. The breaker heals by itself once the
// shard answers again.
type breaker struct {
	cooldown time.Duration
	now      func() time.Time // time.Now; tests set a fake clock
	probe    func() bool      // asks the shard; true when it answered
	start    func(func())     // runs a probe in the background

	mu       sync.Mutex // guards the fields below
	state    breakerState
	openedAt time.Time
	probes   int64 // probes started, ever: the last one's number

	trips atomic.Int64 // times it opened, ever
}

// breakerState is a breaker's state; its value is the metric's.
type breakerState int

const (
	breakerClosed   breakerState = iota // calls go through
	breakerOpen                         // calls are refused at once
	breakerHalfOpen                     // calls are refused at once; a probe is out
)

func (s breakerState) String() string {
	return [...]string{"closed", "open", "half_open"}[s]
}

// newBreaker returns a closed breaker whose probe runs probe by start.
func newBreaker(cooldown time.Duration, probe func() bool, start func(func())) *breaker {
	return &breaker{cooldown: cooldown, now: time.Now, probe: probe, start: start}
}

// allow reports whether a call may go to the shard now: only while the
// breaker is closed. Otherwise it pokes the breaker (see poke).
func (b *breaker) allow() bool {
	b.mu.Lock()
	closed := b.state == breakerClosed
	b.mu.Unlock()
	if closed {
		return true
	}
	b.poke()
	return false
}

// poke turns an open breaker whose cooldown has passed half-open and
// starts its probe. Claims poke it (allow), and so does readiness, so a
// breaker heals with no claims coming too (a load balancer that stopped
// sending grabs on a 503 from /readyz still sees it recover).
func (b *breaker) poke() {
	b.mu.Lock()
	if b.state != breakerOpen || b.now().Sub(b.openedAt) < b.cooldown {
		b.mu.Unlock()
		return
	}
	b.state = breakerHalfOpen
	b.probes++
	gen := b.probes
	b.mu.Unlock()
	b.start(func() { b.probed(gen, b.probe()) })
}

// probed records the outcome of probe number gen, unless the breaker has
// moved on (a batch's outcome came first, or this probe is an older one
// than the breaker's last): a late probe must not reopen a breaker that a
// batch the shard answered has closed, nor speak for a newer probe.
func (b *breaker) probed(gen int64, answered bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != breakerHalfOpen || gen != b.probes {
		return
	}
	if answered {
		b.state = breakerClosed
		return
	}
	b.openLocked()
}

// openLocked opens the breaker for a cooldown from now; b.mu is held.
func (b *breaker) openLocked() {
	b.state, b.openedAt = breakerOpen, b.now()
	b.trips.Add(1)
}

// done records the outcome of a batch sent to the shard: failed means the
// shard did not answer.
func (b *breaker) done(failed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case failed && b.state != breakerOpen:
		b.openLocked()
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
	// Redirected counts groups of claims a cluster sent elsewhere (their
	// slot moved, or was moving) and that were followed there.
	Redirected int64
	// Lingered counts the times the shard's lane waited for the claims it
	// expected before sending a batch, LingerClaims the claims those waits
	// took in, LingerSkipped the waits it did not make because the process
	// had CPU to spare (see batcher.shortOfCPU).
	Lingered, LingerClaims, LingerSkipped int64
}

// ShardStats returns each shard's claim path figures, in shard name order;
// a cluster shard's are per primary a claim has gone to ("cluster/addr"),
// by address.
func (s *Service) ShardStats() []ShardStats {
	var out []ShardStats
	add := func(name string, b *batcher) {
		out = append(out, ShardStats{Name: name, Breaker: int(b.br.current()), Trips: b.br.trips.Load(),
			Failures: b.failures.Load(), Refused: b.refused.Load(), Busy: b.busy.Load(), InFlight: b.inflight.Load(),
			Redirected: b.moved.Load(), Lingered: b.lingered.Load(), LingerClaims: b.lingerClaims.Load(),
			LingerSkipped: b.lingerSkipped.Load()})
	}
	for _, name := range s.shards.Names() {
		if b := s.batchers[name]; b != nil {
			add(name, b)
			continue
		}
		nodes := s.nodeBatchers(name)
		for _, addr := range slices.Sorted(maps.Keys(nodes)) {
			add(nodes[addr].name, nodes[addr])
		}
	}
	return out
}
