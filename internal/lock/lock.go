// Package lock is rain's distributed lock: a redsync (Redlock) mutex over the
// shards, and a watchdog that keeps it alive while its holder works.
//
// Why a watchdog of our own: redsync has no auto-renewal (go-redsync/redsync
// PR #153 was closed as won't fix) and bsm/redislock leaves refreshing to the
// caller. Like Redisson's, a Lease's watchdog extends the lock every TTL/3.
// Unlike a bare mutex, a Lease tells its holder the moment the lock is lost —
// an extension failed or was refused, or the lock's validity ran out before an
// extension came back — by cancelling Lease.Context, so the holder stops at
// once instead of working on under a lock another may hold by now.
//
// A lock alone does not make writes safe: a holder can pause (GC, swap, a slow
// disk) past its TTL and wake after another took over. rain does not rely on
// it for safety: the reaper's release script releases only a grant that is
// still held and past its deadline, checked atomically on the shard, so a
// stale reaper cannot release twice. The lock keeps the work from being done
// by every instance at once; it hands out no fencing token, as nothing in
// rain would check one.
//
// The rules of a lease:
//   - Its context derives from the ctx given to Acquire: cancelling that ctx
//     ends the lease. A reaper whose run ctx is cancelled stops at once and,
//     with the deferred Release, frees the lock for the next instance.
//   - Its context is cancelled, and Lease.Err says why, when the lock is lost
//     (ErrLost), Release is called (ErrReleased), or Acquire's ctx ends (that
//     ctx's cause).
//   - Once its context is cancelled nothing extends the lock: it frees itself
//     at most TTL later. Release frees it at once, and does so even when
//     passed a cancelled ctx, so defer lease.Release(ctx) is the usual form.
//   - The watchdog is one goroutine per lease. It returns by itself when the
//     lease ends for any reason, and Release waits for it, so it never
//     outlives its holder.
//
// A lock is held when a majority of the shards (N/2+1, redsync's quorum) hold
// it, so one shard in three may be down.
//
// Every extension and unlock is bounded by TTL/3 through its ctx, so a dead
// shard (connection refused) costs at most that. A shard that hangs instead
// holds a call up until the client's ReadTimeout, because go-redis applies
// ctx deadlines to sockets only with Options.ContextTimeoutEnabled: give the
// shard clients a ReadTimeout under TTL/3, or enable that option, or the
// watchdog may hear of a loss late (the validity timer still ends the lease
// before the lock can expire).
//
// How the reaper uses it:
//
//	func runReaper(ctx context.Context, locker *lock.Locker) {
//		for {
//			// Waits while another instance reaps; fails only when ctx ends.
//			lease, err := locker.Acquire(ctx, "rain:reaper:lock")
//			if err != nil {
//				return
//			}
//			reap(lease.Context()) // returns as soon as the context is cancelled
//			// Works with a cancelled ctx; an error only means the lock
//			// expires by itself within TTL.
//			_ = lease.Release(ctx)
//			// lease.Err() says why it ended; if it was lost, take it again.
//		}
//	}
package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"rain/internal/wait"

	"github.com/go-redsync/redsync/v4"
	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// Errors. ErrNotAcquired is returned by Acquire; the others are the causes
// Lease.Err reports (match them with errors.Is).
var (
	// ErrNotAcquired is returned when Acquire's ctx ended before the lock
	// could be taken (the error then wraps its cause too).
	ErrNotAcquired = errors.New("lock: not acquired")
	// ErrLost is the cause when an extension failed or was refused (the key
	// was deleted, expired or taken over on a quorum of shards), or when the
	// lock's validity ran out before an extension came back.
	ErrLost = errors.New("lock: lost")
	// ErrReleased is the cause after Release.
	ErrReleased = errors.New("lock: released")
)

// Config configures a Locker. The zero value is usable: every field
// documents its default.
type Config struct {
	// TTL is how long the lock lives on a shard without an extension: the
	// watchdog extends it every TTL/3, and a crashed holder's lock frees
	// itself at most TTL later. Default 8s (redsync's).
	TTL time.Duration
	// RetryDelay is the mean pause between two attempts of Acquire; each
	// pause is drawn from [RetryDelay/2, 3*RetryDelay/2) so contenders do not
	// stay in step. Default 200ms.
	RetryDelay time.Duration
	// Logger gets a line when a lease is lost. Default: discard.
	Logger *slog.Logger
}

func (c *Config) init() {
	if c.TTL <= 0 {
		c.TTL = 8 * time.Second
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = 200 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Locker takes locks over a fixed set of shards. It is safe for concurrent
// use; it owns no goroutine and nothing to close (the clients stay the
// caller's).
type Locker struct {
	rs  *redsync.Redsync
	cfg Config
}

// New returns a Locker over clients, one per shard, in a fixed order (every
// instance must pass the same shards). It panics if clients is empty: a lock
// over no shards is a programming error.
func New(clients []redis.UniversalClient, cfg Config) *Locker {
	if len(clients) == 0 {
		panic("lock: New needs at least one client")
	}
	cfg.init()
	pools := make([]rsredis.Pool, len(clients))
	for i, c := range clients {
		pools[i] = goredis.NewPool(c)
	}
	return &Locker{rs: redsync.New(pools...), cfg: cfg}
}

// Acquire takes the lock name (the Redis key on every shard), retrying every
// RetryDelay until it gets it or ctx ends; the error then wraps
// ErrNotAcquired and ctx's cause.
//
// The lease's context derives from ctx, so ctx is the lifetime of the work,
// not of the wait: a deadline on ctx ends the lease too.
func (l *Locker) Acquire(ctx context.Context, name string) (*Lease, error) {
	for {
		lease, err := l.tryAcquire(ctx, name)
		if err == nil {
			return lease, nil
		}
		if ctx.Err() != nil {
			return nil, gaveUp(ctx, err)
		}
		if err := wait.For(ctx, l.cfg.RetryDelay/2+rand.N(l.cfg.RetryDelay)); err != nil {
			return nil, fmt.Errorf("lock %s: %w: %w", name, ErrNotAcquired, context.Cause(ctx))
		}
	}
}

// gaveUp is Acquire's error when ctx has ended after a try that failed
// with err: err, and ctx's cause if err does not hold it already (ctx
// ended after the try found the lock taken).
func gaveUp(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); !errors.Is(err, cause) {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// tryAcquire makes one attempt at the lock name. Its error wraps
// ErrNotAcquired: another holds the lock, no quorum of shards answered, or
// ctx has ended (then with ctx's cause).
func (l *Locker) tryAcquire(ctx context.Context, name string) (*Lease, error) {
	if ctx.Err() != nil {
		return nil, fmt.Errorf("lock %s: %w: %w", name, ErrNotAcquired, context.Cause(ctx))
	}
	// Not WithFailFast: with it redsync returns at a quorum, and the cancel
	// of the call's ctx then aborts the command to the slowest shard before
	// it is sent. A SET or DEL left undone there stalls the next acquirer
	// until it expires (measured: the contention test ran up to 4x slower),
	// and an extension left undone drops a shard of redundancy while all are
	// up.
	m := l.rs.NewMutex(name, redsync.WithExpiry(l.cfg.TTL), redsync.WithTries(1))
	if err := m.TryLockContext(ctx); err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("lock %s: %w: %w", name, ErrNotAcquired, err)
	}
	return newLease(ctx, name, m, l.cfg), nil
}
