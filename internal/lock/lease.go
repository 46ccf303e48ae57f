package lock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/go-redsync/redsync/v4"
)

// errExpired is the cause when the lock's validity ran out while an
// extension was still on its way (a shard that hangs rather than fails).
var errExpired = fmt.Errorf("%w: validity ran out before an extension came back", ErrLost)

// Lease is one holding of a lock, from Acquire to Release. Its methods are
// safe for concurrent use.
type Lease struct {
	name  string
	log   *slog.Logger
	every time.Duration // the watchdog's interval, TTL/3; also bounds one extension or unlock

	// m is the redsync mutex, which is not safe for concurrent use
	// (ExtendContext writes its validity): the watchdog alone uses it until
	// done is closed, then Release does.
	m *redsync.Mutex

	ctx    context.Context         // ends with the lease; its cause says why
	cancel context.CancelCauseFunc // ends the lease; the first cause wins
	done   chan struct{}           // closed when the watchdog has returned

	release sync.Once
	relErr  error // Release's result, written once under release
}

// newLease starts the watchdog of a lock just taken in m.
func newLease(parent context.Context, name string, m *redsync.Mutex, cfg Config) *Lease {
	ctx, cancel := context.WithCancelCause(parent)
	le := &Lease{
		name:   name,
		log:    cfg.Logger,
		every:  cfg.TTL / 3,
		m:      m,
		ctx:    ctx,
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go le.watch()
	return le
}

// Context is cancelled the moment the lease ends: lock lost, Release, or
// Acquire's ctx ended. Run the work the lock protects under it.
func (le *Lease) Context() context.Context { return le.ctx }

// Name returns the lock's name.
func (le *Lease) Name() string { return le.name }

// Err returns nil while the lease is held, and once its context is cancelled
// why: an error matching ErrLost or ErrReleased, or the cause of
// the ctx given to Acquire (context.Canceled, say).
func (le *Lease) Err() error {
	if le.ctx.Err() == nil {
		return nil
	}
	return context.Cause(le.ctx)
}

// Release ends the lease, waits for its watchdog to return, then unlocks, in
// that order, so no extension can race the unlock.
//
// The unlock keeps ctx's values but not its cancellation, and is bounded
// instead by TTL/3 or the lock's validity, whichever ends first: Release is
// usually deferred with the ctx given to Acquire, which may be cancelled by
// then (at shutdown, when freeing the lock for the next instance matters
// most), and once the validity has run out the lock has expired anyway.
//
// Release returns an error only when the unlock did not reach a quorum of
// shards while the lock was still valid; the lock then expires by itself
// within TTL. A lease that was lost has nothing left to unlock, and Release returns nil. Calling Release again does
// nothing and returns the first call's result.
func (le *Lease) Release(ctx context.Context) error {
	le.release.Do(func() { le.relErr = le.unlock(ctx) })
	return le.relErr
}

func (le *Lease) unlock(ctx context.Context) error {
	le.cancel(ErrReleased)
	<-le.done
	until := le.m.Until()
	if errors.Is(context.Cause(le.ctx), ErrLost) || !time.Now().Before(until) {
		return nil
	}
	uctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), le.deadline())
	defer cancel()
	ok, err := le.m.UnlockContext(uctx)
	if ok || !time.Now().Before(until) {
		return nil
	}
	if err == nil {
		err = errors.New("no quorum")
	}
	return fmt.Errorf("lock %s: unlock: %w", le.name, err)
}

// watch is the watchdog: it extends the lock every interval until the lease
// ends, and ends the lease itself (with ErrLost) the moment an extension
// fails or is refused, or the lock's validity runs out first. Every return
// leaves the lease's context cancelled.
func (le *Lease) watch() {
	defer close(le.done)
	defer le.logEnd()
	expired := time.AfterFunc(time.Until(le.m.Until()), func() { le.cancel(errExpired) })
	defer expired.Stop()
	tick := time.NewTicker(le.every)
	defer tick.Stop()
	for {
		select {
		case <-le.ctx.Done():
			return
		case <-tick.C:
		}
		ok, err := le.extend()
		if le.ctx.Err() != nil {
			return // ended while extending; the extension's outcome does not matter
		}
		if !ok {
			if err == nil {
				err = errors.New("refused")
			}
			le.cancel(fmt.Errorf("%w: extend: %w", ErrLost, err))
			return
		}
		if !expired.Stop() {
			// It fired during the extension; its cancel may not have run yet.
			le.cancel(errExpired)
			return
		}
		expired.Reset(time.Until(le.m.Until()))
	}
}

// extend extends the lock once, within the watchdog's interval and never
// past the lock's validity, so the ticks keep their pace and the holder hears
// of a failure with a third of the TTL to spare. Without the bound, one dead
// shard would hold up every extension: redsync waits for every shard, and
// go-redis retries a refused dial with backoff for as long as its ctx lets it.
func (le *Lease) extend() (bool, error) {
	ctx, cancel := context.WithDeadline(le.ctx, le.deadline())
	defer cancel()
	return le.m.ExtendContext(ctx)
}

// deadline bounds one extension or unlock: TTL/3 from now, or the lock's
// validity if that comes first. Only the watchdog, or Release after the
// watchdog returned, may call it.
func (le *Lease) deadline() time.Time {
	d := time.Now().Add(le.every)
	if until := le.m.Until(); until.Before(d) {
		return until
	}
	return d
}

// logEnd logs the end of a lease its holder did not ask for (the lock
// lost). A lease ended by Release or by Acquire's ctx is the holder's own
// doing and not logged.
func (le *Lease) logEnd() {
	if cause := context.Cause(le.ctx); errors.Is(cause, ErrLost) {
		le.log.Warn("lock lost", "lock", le.name, "cause", cause)
	}
}
