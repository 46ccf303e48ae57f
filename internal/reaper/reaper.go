// Package reaper returns to the stock the amount of every grant not
// confirmed by its deadline. It runs inside every `rain serve`; exactly one
// instance reaps at a time, the one holding the lock, and it stops at once
// when the lock is lost (the lease's context ends).
//
// Safety does not rest on the lock: the release script releases only a grant
// still held and past its deadline, checked atomically on the shard, so two
// reapers at once (a stale holder that has not noticed yet) never release a
// grant twice. The lock keeps the work from being done N times over.
package reaper

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"rain"
	"rain/internal/lock"
	"rain/internal/lua"
	"rain/internal/shard"
	"rain/internal/wait"
)

// Pools is what the reaper reads of the pools' records and registry
// (internal/catalog's Catalog). Each name says whether it reads Redis.
type Pools interface {
	// CachedList is every pool to visit: the registry as last read, read
	// again from Redis when that read is more than a moment old, less the
	// pools seen closed.
	CachedList(ctx context.Context) ([]string, error)
	// Cached is a pool's record: from memory once the pool is open or
	// closed, read from Redis otherwise.
	Cached(ctx context.Context, id string) (*rain.Pool, error)
}

// Locker takes the reaper's lock (lock.Locker does).
type Locker interface {
	Acquire(ctx context.Context, name string) (*lock.Lease, error)
}

// Config tunes a Reaper. Zero fields take the documented defaults.
type Config struct {
	// Interval is the shortest time between two passes over the shards' due
	// indexes (the sub-pools with work). Default 1s.
	Interval time.Duration
	// IdlePoll is the longest: when no sub-pool is due sooner, the indexes
	// are read again after this, for sub-pools marked meanwhile. Default 5s.
	IdlePoll time.Duration
	// FullSweep is how often the leader also sweeps every sub-pool of every
	// live pool, for a mark a crash lost (and once when it starts leading).
	// Default 10m.
	FullSweep time.Duration
	// LockName is the lock every instance competes for. Default "rain:reaper".
	LockName string
	// SpillValidity is a spill reservation's validity (T), as the grab path
	// uses it: reservations older than this are dropped. Default
	// lua.SpillValidity.
	SpillValidity time.Duration
	// SpillAge is how long a spill's transfer stays in flight before the
	// reaper resolves it by the home's verdict (which refuses a token the
	// home has not decided). Safety does not depend on it; a short age only
	// turns away spills still in progress. Default 8s.
	SpillAge time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Reaper sweeps while it holds the lock.
type Reaper struct {
	sweeper *sweeper
	locker  Locker
	cfg     Config

	leader                 atomic.Bool  // holds the lock now
	sweeps, errs           atomic.Int64 // passes made, passes with an error
	released, releasedCts  atomic.Int64 // grants and cents released
	lagMS                  atomic.Int64 // oldest overdue grant at the last pass
	acquisitions, lostLock atomic.Int64
}

func (c *Config) init() {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.IdlePoll < c.Interval {
		c.IdlePoll = max(5*time.Second, c.Interval)
	}
	if c.FullSweep <= 0 {
		c.FullSweep = 10 * time.Minute
	}
	if c.LockName == "" {
		c.LockName = "rain:reaper"
	}
	if c.SpillValidity <= 0 {
		c.SpillValidity = lua.SpillValidity
	}
	if c.SpillAge <= 0 {
		c.SpillAge = 8 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// New returns a reaper of pools on shards; Run starts it.
func New(shards *shard.Set, pools Pools, l Locker, cfg Config) *Reaper {
	cfg.init()
	w := &sweeper{shards: shards, pools: pools, valid: cfg.SpillValidity, age: cfg.SpillAge, log: cfg.Logger, page: dueBatch}
	return &Reaper{sweeper: w, locker: l, cfg: cfg}
}

// Sweep makes one whole pass now, over every sub-pool of every live pool
// (see Run, which follows the shards' due indexes and makes such a pass
// every FullSweep): every grant held past its deadline released, every
// spill a crash left half done finished. Safe without the lock, and beside
// another pass (see the package's comment).
func (r *Reaper) Sweep(ctx context.Context) (Sweep, error) {
	sw, err := r.sweeper.sweepAll(ctx)
	due, _, derr := r.sweeper.sweepDue(ctx)
	return sw.add(due), errors.Join(err, derr)
}

// Run competes for the lock and sweeps every Interval while it holds it,
// until ctx ends; then it releases the lock and returns.
func (r *Reaper) Run(ctx context.Context) {
	for ctx.Err() == nil {
		lease, err := r.locker.Acquire(ctx, r.cfg.LockName)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.cfg.Logger.Warn("reaper: lock", "err", err)
			_ = wait.For(ctx, r.cfg.Interval)
			continue
		}
		r.acquisitions.Add(1)
		r.leader.Store(true)
		r.cfg.Logger.Info("reaper: leading")
		r.lead(lease.Context())
		r.leader.Store(false)
		if errors.Is(lease.Err(), lock.ErrLost) {
			r.lostLock.Add(1)
			r.cfg.Logger.Warn("reaper: lock lost; sweeping stopped", "err", lease.Err())
		}
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = lease.Release(rctx) // an error only means the lock expires by itself
		cancel()
	}
}

// lead sweeps until ctx (the lease's) ends: a whole pass at once and every
// FullSweep, and between them the shards' due indexes, as soon as the
// earliest sub-pool there is due (within [Interval, IdlePoll]).
func (r *Reaper) lead(ctx context.Context) {
	var full time.Time
	for {
		if time.Since(full) >= r.cfg.FullSweep {
			full = time.Now()
			sw, err := r.sweeper.sweepAll(ctx)
			r.record(ctx, sw, err)
		}
		sw, next, err := r.sweeper.sweepDue(ctx)
		r.record(ctx, sw, err)
		pause := r.cfg.IdlePoll
		if !next.IsZero() {
			pause = min(pause, time.Until(next))
		}
		if wait.For(ctx, max(pause, r.cfg.Interval)) != nil {
			return
		}
	}
}

// record counts a pass and logs what it did.
func (r *Reaper) record(ctx context.Context, sw Sweep, err error) {
	r.sweeps.Add(1)
	r.released.Add(sw.Released)
	r.releasedCts.Add(sw.ReleasedCents)
	r.lagMS.Store(sw.OldestOverdue.Milliseconds())
	if sw.Released > 0 {
		r.cfg.Logger.Info("reaper: released expired grants", "count", sw.Released, "cents", sw.ReleasedCents)
	}
	if err != nil && ctx.Err() == nil {
		r.errs.Add(1)
		r.cfg.Logger.Warn("reaper: sweep", "err", err)
	}
}

// Stats is what the reaper did.
type Stats struct {
	Leader                  bool
	Sweeps, Errors          int64
	Released, ReleasedCents int64
	Lag                     time.Duration // oldest overdue grant at the last sweep
	Acquisitions, LostLocks int64
}

// Stats returns a snapshot.
func (r *Reaper) Stats() Stats {
	return Stats{
		Leader: r.leader.Load(), Sweeps: r.sweeps.Load(), Errors: r.errs.Load(),
		Released: r.released.Load(), ReleasedCents: r.releasedCts.Load(),
		Lag:          time.Duration(r.lagMS.Load()) * time.Millisecond,
		Acquisitions: r.acquisitions.Load(), LostLocks: r.lostLock.Load(),
	}
}
