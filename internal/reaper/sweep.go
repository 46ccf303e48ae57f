package reaper

// This file is the reaper's passes: over the sub-pools its shards' due
// indexes name (the work as it comes), and now and then over every sub-pool
// of every live pool (what a lost mark left): the grants held past their
// deadline released, the spills a crash left half done finished.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/lua"
	"rain/internal/shard"
)

// releaseBatch is how many users of due deadline index members one
// release script call looks at (and the rest of its last member, a batch
// of claims at most), so no call blocks a shard for long.
const releaseBatch = 500

// Sweep is what one pass did.
type Sweep struct {
	Released, ReleasedCents int64
	// OldestOverdue is how long past its deadline the oldest overdue grant
	// was when the pass reached it: the reaper's lag.
	OldestOverdue time.Duration
}

// add is both passes' work.
func (s Sweep) add(o Sweep) Sweep {
	return Sweep{Released: s.Released + o.Released, ReleasedCents: s.ReleasedCents + o.ReleasedCents,
		OldestOverdue: max(s.OldestOverdue, o.OldestOverdue)}
}

// sweeper makes the passes.
type sweeper struct {
	shards     *shard.Set
	pools      Pools
	valid, age time.Duration // the spill reservation's validity (T), a transfer's age before it is resolved
	log        logger
	page       int // sub-pools per read of a due index: dueBatch
}

// logger is what the sweeper logs with (*slog.Logger).
type logger interface {
	Error(msg string, args ...any)
}

// dueBatch is the most sub-pools one read of a shard's due index returns
// (sweeper.page, but in tests).
const dueBatch = 1000

// startMargin is how long before a pool's window starts, by this
// instance's clock, the slow pass sweeps it (the shards' clocks decide).
const startMargin = time.Minute

// sweepDue sweeps the sub-pools whose time has come in every shard's due
// index (lua.MarkDue: the grabs mark the sub-pools they grant or take
// from), and tells each index when to look again, or drops a sub-pool with
// nothing left to do. It returns the earliest time a sub-pool not due yet
// is (zero: none), so the reaper can sleep until then. An idle season
// costs each shard one read per pass.
func (w *sweeper) sweepDue(ctx context.Context) (Sweep, time.Time, error) {
	var sw Sweep
	var errs []error
	var next time.Time
	sooner := func(at time.Time) {
		if !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	for _, name := range w.shards.Names() {
		c := w.shards.Client(name)
		// skip: the due sub-pools this pass met and could not move on (the
		// next read starts past them, so each read makes progress).
		for skip := 0; ; {
			if err := ctx.Err(); err != nil {
				return sw, next, err
			}
			due, later, err := lua.ReadDue(ctx, c, skip, w.page)
			if err != nil {
				errs = append(errs, fmt.Errorf("%w: read the due index of shard %s: %w", rain.ErrUnavailable, name, err))
				break
			}
			if later >= 0 {
				sooner(time.Now().Add(later))
			}
			for _, d := range due {
				at, stays, err := w.due(ctx, name, d, &sw)
				if err != nil {
					errs = append(errs, err)
				}
				if stays {
					skip++
				}
				sooner(at)
			}
			if len(due) < w.page {
				break
			}
		}
	}
	return sw, next, errors.Join(errs...)
}

// retryAfter is when a due sub-pool whose sweep failed is looked at again.
const retryAfter = 5 * time.Second

// due sweeps the sub-pool d of shard name's due index and tells the index
// when it next needs a look (returned; zero when it has nothing left to
// do, or is no longer a live sub-pool of that shard, and leaves the
// index). A sub-pool whose sweep fails is looked at again after retryAfter.
// stays reports whether d is still due in the index (marked since it was
// read, or the index could not be told).
func (w *sweeper) due(ctx context.Context, name string, d lua.Due, sw *Sweep) (at time.Time, stays bool, err error) {
	in := time.Duration(-1) // nothing to do
	sp, ok := rain.ParseMeta(d.Meta)
	if ok {
		p, perr := w.pools.Cached(ctx, sp.Pool)
		switch {
		case errors.Is(perr, rain.ErrNotFound):
		case perr != nil:
			in, err = retryAfter, perr // a shard down: looked at again later
		case p.State.Over(), sp.Index >= p.SubPools(), p.SubPool(sp.Index) != sp, p.Placement[sp.Index] != name:
			// closing or closed: nothing held; or not this shard's
		default:
			next, active, serr := w.subPool(ctx, p, sp.Index, sw)
			switch {
			case serr != nil:
				in, err = retryAfter, serr
			case active:
				in = next
			}
		}
	}
	done, derr := lua.DoneDue(ctx, w.shards.Client(name), d, in)
	if derr != nil {
		return time.Time{}, true, errors.Join(err, fmt.Errorf("%w: update the due index of shard %s: %w", rain.ErrUnavailable, name, derr))
	}
	switch done {
	case lua.DueMoved:
		if in < 0 {
			in = lua.DueQuiet // marked a moment ago: looked at again once quiet
		}
		return time.Now().Add(in), false, err
	case lua.DueStays:
		return time.Time{}, true, err
	}
	return time.Time{}, false, err
}

// sweepAll makes one slow pass over every sub-pool of every pool that may
// hold something (neither closing nor closed, its window started or about
// to): grants held past their deadline released, spills a crash left half
// done finished, and a sub-pool with work left put in its shard's due
// index. The index does the work as it comes; this pass makes up for a
// mark lost to a crash between a grant and its mark. It stops at once, with
// ctx's error, when ctx ends; sub-pools it cannot reach are skipped and
// their errors returned, joined, with what it did. Each release is checked
// inside its script (still held, past the deadline by the shard's clock),
// so two passes at once, or a stale one, never release a grant twice.
func (w *sweeper) sweepAll(ctx context.Context) (Sweep, error) {
	var sw Sweep
	ids, err := w.pools.CachedList(ctx)
	errs := []error{err}
	for _, id := range ids {
		p, err := w.pools.Cached(ctx, id)
		if errors.Is(err, rain.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err) // a shard down: the next pass retries
			continue
		}
		if p.State.Over() || p.Spec.StartsAt != nil && time.Until(*p.Spec.StartsAt) > startMargin {
			continue // nothing held: closing or closed, or not started
		}
		for j := range p.SubPools() {
			if err := ctx.Err(); err != nil {
				return sw, err
			}
			name := p.Placement[j]
			c := w.shards.Client(name)
			if c == nil {
				errs = append(errs, fmt.Errorf("%w: pool %s sub-pool %d is on shard %s, which is not configured here",
					rain.ErrUnavailable, p.ID(), j, name))
				continue
			}
			next, active, err := w.subPool(ctx, p, j, &sw)
			if err == nil && active {
				// Due when its work is, or sooner if the index says so: a
				// transfer in flight found here falls due before the
				// grants the index may have it due for.
				err = lua.MarkDueSooner(ctx, c, next, []string{p.SubPool(j).Keys().Meta})
			}
			if err != nil {
				errs = append(errs, err) // swept again next pass
			}
		}
	}
	return sw, errors.Join(errs...)
}

// subPool sweeps sub-pool j of p: its spills first, then its releases. It
// returns how long until the sub-pool can next have work, and whether it
// has any left (a grant held, a transfer in flight).
func (w *sweeper) subPool(ctx context.Context, p *rain.Pool, j int, sw *Sweep) (time.Duration, bool, error) {
	c := w.shards.Client(p.Placement[j])
	k := p.SubPool(j).Keys()
	// next is the sooner of what is held and what is in flight; a sub-pool
	// whose spills could not be read is looked at again after the age.
	next, active := time.Duration(0), false
	soon := func(d time.Duration) {
		if !active || d < next {
			next = d
		}
		active = true
	}
	var errs []error
	if p.SubPools() > 1 {
		f, err := w.recoverSpills(ctx, p, j)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%w: recover spills of %s sub-pool %d: %w", rain.ErrUnavailable, p.ID(), j, err))
			soon(w.age)
		case f.Count > 0:
			soon(time.Duration(f.NextMS) * time.Millisecond)
		}
	}
	for more := true; more; {
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		r, err := lua.ReleaseExpired(ctx, c, &k, releaseBatch)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: release %s sub-pool %d: %w", rain.ErrUnavailable, p.ID(), j, err))
			break
		}
		sw.Released += r.Count
		sw.ReleasedCents += r.Cents
		sw.OldestOverdue = max(sw.OldestOverdue, time.Duration(r.OldestOverdueMS)*time.Millisecond)
		more = r.More
		if r.Held > 0 {
			soon(time.Duration(r.NextMS) * time.Millisecond)
		}
	}
	return next, active, errors.Join(errs...)
}

// recoverSpills drops expired reservations of sub-pool j and resolves its
// transfers in flight for longer than the age by their home's verdict (decide
// refuses the token if the home has not decided it): ack when adopted from j
// with this amount, untake otherwise (the protocol:
// docs/architecture.md#the-spill-protocol).
//
// It returns what it found in flight there.
func (w *sweeper) recoverSpills(ctx context.Context, p *rain.Pool, j int) (lua.InFlight, error) {
	client := func(i int) redis.UniversalClient { return w.shards.Client(p.Placement[i]) }
	k := p.SubPool(j).Keys()
	f, err := lua.StaleTransfers(ctx, client(j), &k, w.valid.Milliseconds(), w.age.Milliseconds())
	if err != nil {
		return f, err
	}
	var errs []error
	for _, t := range f.Stale {
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
		hc, replicated, err := w.shards.Writer(ctx, p.Placement[t.Home], hk.Meta)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var wait time.Duration
		if replicated {
			wait = w.shards.Timeout() / 2 // the verdict on a replica before the sibling acts on it
		}
		v, err := lua.Decide(ctx, hc, &hk, t.Token, t.User, wait)
		if err != nil {
			errs = append(errs, w.shards.Redirected(ctx, p.Placement[t.Home], err))
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
	return f, errors.Join(errs...)
}
