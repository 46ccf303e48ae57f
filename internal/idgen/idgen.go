// Package idgen hands out grant serials: int64 IDs unique across every
// generator and process that shares one Redis key, strictly increasing within
// one generator, with gaps allowed.
//
// It is the segment mode of Meituan's Leaf, on Redis INCRBY instead of a
// database row. A generator holds a segment of IDs, [start, end], reserved with
// one INCRBY key step, and serves it with one atomic add per ID: no mutex, no
// allocation, no Redis call on the hot path. When the current segment is used
// past a threshold (10% by default, as Leaf), a single background loader
// reserves the next segment, so by the time the current one runs out the
// switch is an atomic pointer swap and Next never waits on Redis in steady
// state.
//
// The step adapts, as Leaf's: a segment used up faster than Config.Target
// doubles the next step, one that lasted more than twice Target halves it,
// always within [MinStep, MaxStep].
//
// Safety: a new segment that starts at or below the highest ID this generator
// has already reserved (hence at or below anything it handed out) is refused
// and counted, never served. That catches a Redis that lost writes, e.g. a
// failover or an AOF restore behind what it acknowledged. After a refusal the
// loader asks Redis for a larger increment that carries the key past what this
// generator reserved, so it heals by itself; the refusal stays visible in
// Stats. The guard is per generator: uniqueness across processes rests on the
// key never going backwards (AOF with fsync, a replica that is up to date).
//
// With Redis down the generator keeps serving what it has buffered (up to two
// segments); with both buffers empty Next returns ErrUnavailable at once, and
// the loader retries with backoff until Redis is back.
//
// Figures (2-core machine; go test -run x -bench . ./internal/idgen):
// docs/benchmarks.md#the-figures has the last measured numbers.
package idgen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by Next.
var (
	// ErrUnavailable is returned when both buffers are empty and no segment
	// could be loaded: Redis is down, too slow, or refused segments.
	ErrUnavailable = errors.New("idgen: no ids buffered and the allocator is unavailable")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("idgen: generator closed")
	// ErrBackwards is recorded (see Stats.LastError) when the allocator
	// returns a segment at or below an ID this generator already reserved.
	ErrBackwards = errors.New("idgen: allocator went backwards")
)

// Allocator reserves ranges of IDs. Alloc atomically adds n to a shared
// counter and returns its new value, reserving (end-n, end] for the caller.
// RedisAllocator is the production implementation; tests wrap it to add
// latency or errors.
type Allocator interface {
	Alloc(ctx context.Context, n int64) (end int64, err error)
}

// Config tunes a Generator. Every zero field means its documented default.
type Config struct {
	// MinStep and MaxStep bound the segment size. Defaults 1,000 and 16,000,000.
	MinStep, MaxStep int64
	// Threshold is the fraction of the current segment used at which the next
	// one is loaded, in (0, 1). Default 0.1, as Leaf.
	Threshold float64
	// Target is how long one segment should last. Faster than Target doubles
	// the next step; slower than 2×Target halves it. Default 10s.
	Target time.Duration
	// Wait is how long Next waits for a load already in flight when both
	// buffers are empty and the allocator is healthy (at start, or after a
	// burst outran the loader). It is bounded by ctx too. Default 200ms.
	// When the last load failed, Next does not wait at all.
	Wait time.Duration
	// LoadTimeout bounds one Alloc call. Default 2s.
	LoadTimeout time.Duration
	// MinBackoff and MaxBackoff bound the retry delay after a failed load.
	// Defaults 10ms and 1s.
	MinBackoff, MaxBackoff time.Duration
	// Now is the clock used to time segments. Default time.Now.
	Now func() time.Time
}

func (c *Config) init() error {
	if c.MinStep == 0 {
		c.MinStep = 1000
	}
	if c.MaxStep == 0 {
		c.MaxStep = 16_000_000
	}
	if c.MaxStep < c.MinStep {
		c.MaxStep = c.MinStep
	}
	if c.Threshold == 0 {
		c.Threshold = 0.1
	}
	if c.Target == 0 {
		c.Target = 10 * time.Second
	}
	if c.Wait == 0 {
		c.Wait = 200 * time.Millisecond
	}
	if c.LoadTimeout == 0 {
		c.LoadTimeout = 2 * time.Second
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 10 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	switch {
	case c.MinStep < 1:
		return fmt.Errorf("idgen: MinStep %d < 1", c.MinStep)
	case c.Threshold <= 0 || c.Threshold >= 1:
		return fmt.Errorf("idgen: Threshold %v not in (0, 1)", c.Threshold)
	}
	return nil
}

// segment is a reserved range [start, end]. Only pos changes after creation.
type segment struct {
	pos     atomic.Int64 // last ID handed out; start-1 before the first
	start   int64
	end     int64
	trigger int64 // handing out this ID asks the loader for the next segment
}

func newSegment(start, end int64, threshold float64) *segment {
	s := &segment{start: start, end: end}
	s.pos.Store(start - 1)
	s.trigger = start + int64(float64(end-start+1)*threshold)
	if s.trigger > end {
		s.trigger = end
	}
	return s
}

// Generator hands out IDs. It must be created with New and stopped with Close.
type Generator struct {
	alloc Allocator
	cfg   Config

	cur  atomic.Pointer[segment] // the segment Next serves from; never nil
	next atomic.Pointer[segment] // the buffered next segment, or nil

	kick   chan struct{}                 // wakes the loader; capacity 1
	wake   atomic.Pointer[chan struct{}] // closed and replaced after every load attempt
	down   atomic.Bool                   // the last load failed
	stop   chan struct{}                 // closed by Close
	cancel context.CancelFunc            // ends an Alloc in flight; called by Close
	done   chan struct{}                 // closed when the loader exits
	once   sync.Once                     // guards close(stop)

	loads, loadErrors, stalls, refusals, switches atomic.Int64

	mu        sync.Mutex // guards the fields below; taken by the loader and Stats, never by Next
	step      int64      // size of the next Alloc
	highest   int64      // end of the last accepted segment
	catchUp   int64      // extra increment after a refusal, to pass highest
	lastLoad  time.Time  // when the last segment was accepted
	lastError error
}

// New starts a generator on alloc. It does no I/O itself: the loader fetches
// the first segment in the background at once, and the first Next waits up to
// Config.Wait for it.
func New(alloc Allocator, cfg Config) (*Generator, error) {
	if err := cfg.init(); err != nil {
		return nil, err
	}
	g := &Generator{
		alloc: alloc,
		cfg:   cfg,
		kick:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		step:  cfg.MinStep,
	}
	// Before the first load the current segment is empty (end < start).
	g.cur.Store(&segment{start: 1})
	w := make(chan struct{})
	g.wake.Store(&w)
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	go g.loader(ctx)
	g.poke()
	return g, nil
}

// Next returns a new ID. In steady state it is one atomic add. It returns
// ErrUnavailable when both buffers are empty and no segment can be had in
// time, and ErrClosed after Close.
func (g *Generator) Next(ctx context.Context) (int64, error) {
	for {
		s := g.cur.Load()
		id := s.pos.Add(1)
		if id <= s.end {
			if id == s.trigger {
				g.poke()
			}
			return id, nil
		}
		if err := g.advance(ctx, s); err != nil {
			return 0, err
		}
	}
}

// poke wakes the loader without blocking.
func (g *Generator) poke() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// advance replaces the exhausted segment s with the buffered one, waiting for
// the loader if there is none.
func (g *Generator) advance(ctx context.Context, s *segment) error {
	if n := g.next.Load(); n != nil {
		if g.cur.CompareAndSwap(s, n) {
			g.next.CompareAndSwap(n, nil)
			g.switches.Add(1)
			// If n passed its trigger while it was still buffered, that poke
			// found nothing to do; ask again. Otherwise leave the loader be:
			// waking it at every switch would cost the switch a reschedule.
			if n.pos.Load() >= n.trigger {
				g.poke()
			}
		}
		return nil
	}
	if g.cur.Load() != s {
		return nil // another goroutine switched meanwhile
	}
	return g.stall(ctx, s)
}

// stall waits for a load in flight, or fails at once when the allocator is down.
func (g *Generator) stall(ctx context.Context, s *segment) error {
	g.stalls.Add(1)
	g.poke()
	var timer *time.Timer
	for {
		select {
		case <-g.stop:
			return ErrClosed
		default:
		}
		w := *g.wake.Load()
		// Re-check after taking the wake channel so a load that finished in
		// between is not missed.
		if g.next.Load() != nil || g.cur.Load() != s {
			return nil
		}
		if g.down.Load() {
			return g.unavailable()
		}
		if timer == nil {
			timer = time.NewTimer(g.cfg.Wait)
			defer timer.Stop()
		}
		select {
		case <-w:
		case <-timer.C:
			return g.unavailable()
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrUnavailable, ctx.Err())
		case <-g.stop:
			return ErrClosed
		}
	}
}

func (g *Generator) unavailable() error {
	g.mu.Lock()
	err := g.lastError
	g.mu.Unlock()
	if err == nil {
		return ErrUnavailable
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// Close stops the loader and waits for it. Next returns ErrClosed once the
// buffers run out. Close is safe to call more than once.
func (g *Generator) Close() error {
	g.once.Do(func() {
		close(g.stop)
		g.cancel()
	})
	<-g.done
	return nil
}

// Segment is a reserved range of IDs, both ends included.
type Segment struct {
	Start, End int64
	// Used is how many IDs of it were handed out.
	Used int64
}

// Stats is a snapshot for metrics.
type Stats struct {
	Current Segment
	Next    Segment // zero when none is buffered
	// Step is the size of the next load.
	Step int64
	// Loads counts segments accepted; LoadErrors failed Alloc calls.
	Loads, LoadErrors int64
	// Stalls counts the times Next found both buffers empty and had to wait
	// for a load or fail.
	Stalls int64
	// Refusals counts segments refused by the monotonic guard.
	Refusals int64
	// Switches counts segment switches.
	Switches int64
	// LastError is the last load error, nil after a successful load.
	LastError error
}

// Stats returns a snapshot. It is safe to call at any time.
func (g *Generator) Stats() Stats {
	st := Stats{
		Current:    snapshot(g.cur.Load()),
		Loads:      g.loads.Load(),
		LoadErrors: g.loadErrors.Load(),
		Stalls:     g.stalls.Load(),
		Refusals:   g.refusals.Load(),
		Switches:   g.switches.Load(),
	}
	if n := g.next.Load(); n != nil {
		st.Next = snapshot(n)
	}
	g.mu.Lock()
	st.Step = g.step
	st.LastError = g.lastError
	g.mu.Unlock()
	return st
}

func snapshot(s *segment) Segment {
	if s.end < s.start {
		return Segment{}
	}
	used := min(s.pos.Load(), s.end) - s.start + 1
	return Segment{Start: s.start, End: s.end, Used: used}
}
