package reaper

// This file is one pass of the reaper over every sub-pool: the grants held
// past their deadline released, the spills a crash left half done finished.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/catalog"
	"rain/internal/lua"
)

// releaseBatch is the most grants one release script call handles, so no
// call blocks a shard for long.
const releaseBatch = 500

// Sweep is what one pass did.
type Sweep struct {
	Released, ReleasedCents int64
	// OldestOverdue is how long past its deadline the oldest overdue grant
	// was when the pass reached it: the reaper's lag.
	OldestOverdue time.Duration
}

// sweeper makes the passes. Its due times are its own: a pass skips a
// sub-pool until the shard said something there can be due.
type sweeper struct {
	cat        *catalog.Catalog
	valid, age time.Duration // the spill reservation's validity (T), a transfer's age before it is resolved
	log        logger

	mu  sync.Mutex                // guards due
	due map[lua.SubPool]time.Time // when each sub-pool next needs a sweep
}

// logger is what the sweeper logs with (*slog.Logger).
type logger interface {
	Error(msg string, args ...any)
}

// sweep makes one pass over the sub-pools of every pool that may have
// work, and releases the grants still held past their deadline, in
// batches, and resolves spills in flight for too long. It stops at once,
// with ctx's error, when ctx ends; sub-pools it cannot reach are skipped and
// their errors returned, joined, with what it did. Each release is checked
// inside its script (still held, past the deadline by the shard's clock), so
// two passes at once, or a stale one, never release a grant twice.
//
// A pass skips a sub-pool until it may have work: each sweep learns from the
// shard how long until a grant there can next fall due (its earliest
// deadline, and at most the pool's hold, as a grant made later falls due no
// sooner) and until a spill in flight can next need resolving (at most the
// age). So an idle pool costs its shards two calls per sub-pool every age,
// not every pass.
func (w *sweeper) sweep(ctx context.Context) (Sweep, error) {
	var sw Sweep
	ids, err := w.cat.Listed(ctx)
	errs := []error{err}
	now := time.Now()
	for _, id := range ids {
		p, err := w.cat.Pool(ctx, id)
		if errors.Is(err, catalog.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err) // a shard down: the next pass retries
			continue
		}
		if p.State.Over() {
			continue // closing or closed: nothing held
		}
		for j := range p.SubPools() {
			if err := ctx.Err(); err != nil {
				return sw, err
			}
			sp := p.SubPool(j)
			if w.cat.Shards().Client(p.Placement[j]) == nil {
				errs = append(errs, fmt.Errorf("%w: pool %s sub-pool %d is on shard %s, which is not configured here",
					catalog.ErrUnavailable, p.ID(), j, p.Placement[j]))
				continue
			}
			if due, ok := w.dueAt(sp); ok && now.Before(due) {
				continue
			}
			next, err := w.subPool(ctx, p, j, &sw)
			if err != nil {
				errs = append(errs, err) // swept again next pass
				continue
			}
			w.setDue(sp, now.Add(next))
		}
	}
	return sw, errors.Join(errs...)
}

// subPool sweeps sub-pool j of p: its spills first, then its releases. It
// returns how long until the sub-pool can next have work.
func (w *sweeper) subPool(ctx context.Context, p *catalog.Pool, j int, sw *Sweep) (time.Duration, error) {
	c := w.cat.Shards().Client(p.Placement[j])
	k := p.SubPool(j).Keys()
	next := w.age
	var errs []error
	if p.SubPools() > 1 {
		n, err := w.recoverSpills(ctx, p, j)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: recover spills of %s sub-pool %d: %w", catalog.ErrUnavailable, p.ID(), j, err))
		}
		next = min(next, n) // its releases go on
	}
	for more := true; more; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		r, err := lua.ReleaseExpired(ctx, c, &k, releaseBatch)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: release %s sub-pool %d: %w", catalog.ErrUnavailable, p.ID(), j, err))
			break
		}
		sw.Released += r.Count
		sw.ReleasedCents += r.Cents
		sw.OldestOverdue = max(sw.OldestOverdue, time.Duration(r.OldestOverdueMS)*time.Millisecond)
		more = r.More
		next = min(next, time.Duration(r.NextMS)*time.Millisecond)
	}
	return next, errors.Join(errs...)
}

// dueAt is when sub-pool sp next needs a sweep; ok is false when it was
// never swept (by this reaper).
func (w *sweeper) dueAt(sp lua.SubPool) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.due[sp]
	return t, ok
}

func (w *sweeper) setDue(sp lua.SubPool, t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.due[sp] = t
}

// recoverSpills drops expired reservations of sub-pool j and resolves its
// transfers in flight for longer than the age by their home's verdict (decide
// refuses the token if the home has not decided it): ack when adopted from j
// with this amount, untake otherwise (the protocol:
// docs/architecture.md#the-spill-protocol).
//
// It returns how long until a transfer of j can next need resolving.
func (w *sweeper) recoverSpills(ctx context.Context, p *catalog.Pool, j int) (time.Duration, error) {
	client := func(i int) redis.UniversalClient { return w.cat.Shards().Client(p.Placement[i]) }
	k := p.SubPool(j).Keys()
	stale, nextMS, err := lua.StaleTransfers(ctx, client(j), &k, w.valid.Milliseconds(), w.age.Milliseconds())
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, t := range stale {
		if t.Home < 0 || t.Home >= p.SubPools() || t.Home == j {
			errs = append(errs, fmt.Errorf("transfer %s of sub-pool %d names home %d of %d sub-pools", t.Token, j, t.Home, p.SubPools()))
			continue
		}
		if client(t.Home) == nil {
			errs = append(errs, fmt.Errorf("transfer %s of sub-pool %d: its home %d is on shard %s, which is not configured here",
				t.Token, j, t.Home, p.Placement[t.Home]))
			continue
		}
		hk := p.SubPool(t.Home).Keys()
		hc, replicated, err := w.cat.Shards().Writer(ctx, p.Placement[t.Home], hk.Meta)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var wait time.Duration
		if replicated {
			wait = w.cat.Shards().Timeout() / 2 // the verdict on a replica before the sibling acts on it
		}
		v, err := lua.Decide(ctx, hc, &hk, t.Token, t.User, wait)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		adopted := v.Adopted && v.Origin == j && v.Amount == t.Amount
		if v.Adopted && !adopted {
			w.log.Error("spill token adopted from another sibling or with another amount; untaking here",
				"pool_id", p.ID(), "sub_pool", j, "home", t.Home, "token", t.Token,
				"verdict_origin", v.Origin, "verdict_amount", v.Amount, "transfer_amount", t.Amount)
		}
		resolve := lua.Untake
		if adopted {
			resolve = lua.Ack
		}
		res, err := resolve(ctx, client(j), &k, t.Token)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if res == lua.ResolveConflict {
			errs = append(errs, fmt.Errorf("transfer %s of sub-pool %d was resolved the other way", t.Token, j))
		}
	}
	return time.Duration(nextMS) * time.Millisecond, errors.Join(errs...)
}
