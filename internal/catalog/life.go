package catalog

// This file is the end of a pool's life: its end (no more grabs), its close
// (the account recorded, the system of record reconciled, the keys freed),
// and the account that stays.
//
// preload → open → ended (its window over, or End) → settled (every outbox
// entry acknowledged) → closed (the account recorded, every key freed).
// Each step is idempotent and resumable after a crash: Close runs its steps
// in an order whose every prefix Close, run again, finishes.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"rain"
	"rain/internal/events"
	"rain/internal/lua"
)

// Books is the system of record a close reconciles with
// (internal/postgres): the grants settlement delivered there, and the
// accounts of closed pools.
type Books interface {
	// Totals returns what the books hold of the pool's grants, by sub-pool
	// index.
	Totals(ctx context.Context, poolID string) (map[int]rain.Tally, error)
	// Record stores the account of a closed pool. The same account again
	// (its sums, sub-pool by sub-pool; the time aside) is a no-op; another
	// under the same pool id is an error.
	Record(ctx context.Context, a *rain.Account) error
	// Settled returns the serials of the user's grants in the pool that
	// the books hold: delivered by settlement (paid, so confirmed), and
	// recorded by it as released at their deadline.
	Settled(ctx context.Context, poolID, userID string) (paid, released []int64, err error)
}

// End ends the pool now: from then on every grab answers ended (a user who
// holds a grant still gets it back), and held grants run out their hold.
// Ending an ended or closed pool changes nothing. It returns the pool's
// status. ErrNotFound for no such pool; ErrNotNow for a pool still loading.
func (c *Catalog) End(ctx context.Context, id string) (*rain.Status, error) {
	p, err := c.Read(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := c.placed(p); err != nil {
		return nil, err
	}
	switch p.State {
	case rain.Loading:
		return nil, rain.Errorf(rain.ErrNotNow, nil, "pool %s is still loading: finish its preload first", id)
	case rain.Open:
		for j := range p.SubPools() {
			k := p.SubPool(j).Keys()
			if _, err := lua.End(ctx, c.client(p, j), &k); err != nil {
				return nil, rain.Errorf(rain.ErrUnavailable, err, "end %s sub-pool %d: shard %s did not answer", id, j, p.Placement[j])
			}
		}
		c.notify(ctx, id)
	}
	return c.Status(ctx, id)
}

// placed checks that every shard the pool's sub-pools live on is one of
// the catalog's (a tool or instance given fewer shards than the pool was
// placed on): a step on every sub-pool is then refused before it begins,
// never left done on some. ErrUnavailable names the first missing shard.
func (c *Catalog) placed(p *rain.Pool) error {
	if p.State == rain.Closed {
		return nil // its sub-pools are not visited again (a closing pool's are: they are retired)
	}
	for j, name := range p.Placement {
		if c.shards.Client(name) == nil {
			return rain.Errorf(rain.ErrUnavailable, nil, "pool %s sub-pool %d is on shard %s, which is not configured here", p.ID(), j, name)
		}
	}
	return nil
}

// notify tells every instance that the pool's life moved on: what they keep
// of it lapses (the life counter, read with the registry, covers a notice
// that is lost).
func (c *Catalog) notify(ctx context.Context, id string) {
	c.Forget(id)
	c.moved(ctx, id)
	if err := events.Publish(ctx, c.shards.Clients(), events.Event{Kind: events.State, Pool: id}); err != nil {
		c.log.Warn("pool state notice not published on every shard", "pool_id", id, "err", err)
	}
}

// Close closes a pool whose life is over and returns its final account. It
// closes only once the pool has ended, nothing is held, settlement has
// acknowledged every outbox entry and the audit is ok, and, with Books, the
// books hold exactly the pool's confirmed grants, count and cents, sub-pool
// by sub-pool; otherwise it returns ErrNotNow with the reasons, and nothing
// changes. Closing records the account in the books (when configured) and
// in the pool's record on every shard, then frees every key of the pool,
// sub-pool by sub-pool. A close that died midway finishes when run again;
// closing a closed pool returns its account.
func (c *Catalog) Close(ctx context.Context, id string) (*rain.Account, error) {
	p, err := c.readRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := c.placed(&p.Pool); err != nil {
		return nil, err
	}
	switch p.State {
	case rain.Closed:
		return p.Account, nil
	case rain.Loading:
		return nil, rain.Errorf(rain.ErrNotNow, nil, "pool %s is still loading", id)
	case rain.Open:
		if p, err = c.seal(ctx, p); err != nil {
			return nil, err
		}
	}
	// Closing: the account is in the record; free the keys, then say so.
	if err := c.free(ctx, &p.Pool); err != nil {
		return nil, err
	}
	closed := *p
	a := *p.Account
	a.State = string(rain.Closed)
	closed.State, closed.Account = rain.Closed, &a
	if err := c.writeRecord(ctx, &closed); err != nil {
		return nil, err
	}
	c.notify(ctx, id)
	return closed.Account, nil
}

// seal stops every sub-pool of the open pool r for good (lua.Seal, under
// a token of this call's own: concurrent closes never undo each other's
// seals), checks the audit and the books, records the account (books
// first, then the record on every shard, as closing) and returns the
// closing pool. When a check fails it opens again the sub-pools it sealed
// and returns ErrNotNow: nothing changed (a sealed sub-pool answers grabs
// "ended", as an ended one does).
func (c *Catalog) seal(ctx context.Context, r *record) (*record, error) {
	p := &r.Pool
	owner := strconv.FormatUint(rand.Uint64(), 36)
	seals := make([]lua.Sealed, p.SubPools())
	var reasons []string
	for j := range p.SubPools() {
		k := p.SubPool(j).Keys()
		s, err := lua.Seal(ctx, c.client(p, j), &k, owner, c.lease)
		if err != nil {
			// The seal may have run: unsealing it too is safe (only this
			// owner's seal is opened).
			seals[j].OK = true
			c.unseal(ctx, p, owner, seals)
			return nil, rain.Errorf(rain.ErrUnavailable, err, "seal %s sub-pool %d: shard %s did not answer", p.ID(), j, p.Placement[j])
		}
		seals[j] = s
		if !s.OK {
			reasons = append(reasons, sealReason(j, s))
			if s.Reason == "sealing" {
				break // another close is at work: leave it the sub-pools it has not reached
			}
		}
	}
	if len(reasons) == 0 {
		reasons = c.reconcile(ctx, p, seals)
	}
	if len(reasons) > 0 {
		c.unseal(ctx, p, owner, seals)
		return nil, rain.Errorf(rain.ErrNotNow, nil, "pool %s cannot close: %s", p.ID(), strings.Join(reasons, "; "))
	}
	a := account(p, seals)
	if c.books != nil {
		if err := c.books.Record(ctx, a); err != nil {
			c.unseal(ctx, p, owner, seals)
			return nil, rain.Errorf(rain.ErrUnavailable, err, "record the account of %s in the books", p.ID())
		}
	}
	closing := *r
	closing.State, closing.Account = rain.Closing, a
	if err := c.writeRecord(ctx, &closing); err != nil {
		return nil, err // sealed, and the account is in the books: running Close again finishes
	}
	return &closing, nil
}

// sealReason says why sub-pool j did not seal.
func sealReason(j int, s lua.Sealed) string {
	switch s.Reason {
	case "window":
		return fmt.Sprintf("sub-pool %d: window open", j)
	case "held":
		return fmt.Sprintf("sub-pool %d: %d grants held", j, s.N)
	case "inflight":
		return fmt.Sprintf("sub-pool %d: %d spills in flight", j, s.N)
	case "unsettled":
		return fmt.Sprintf("sub-pool %d: %d entries unsettled", j, s.N)
	case "sealing":
		return fmt.Sprintf("sub-pool %d: another close is at work on it (its seal lapses in %s)", j,
			(time.Duration(s.N) * time.Millisecond).Round(time.Second))
	case "closed":
		return fmt.Sprintf("sub-pool %d: closed already (run the close again)", j)
	}
	return fmt.Sprintf("sub-pool %d: %s", j, s.Reason)
}

// reconcile checks a sealed pool: the audit, and the books' grants against
// the sub-pools' confirmed ones. It returns what disagrees.
func (c *Catalog) reconcile(ctx context.Context, p *rain.Pool, seals []lua.Sealed) []string {
	rep, err := c.Audit(ctx, p.ID())
	if err != nil {
		return []string{fmt.Sprintf("audit: %v", err)}
	}
	var out []string
	for _, pr := range rep.Problems {
		out = append(out, "audit: "+pr.String())
	}
	if c.books == nil {
		return out
	}
	totals, err := c.books.Totals(ctx, p.ID())
	if err != nil {
		return append(out, fmt.Sprintf("books: %v", err))
	}
	for j, s := range seals {
		if got := totals[j]; got.Count != s.ConfirmedCount || got.Cents != s.ConfirmedCents {
			out = append(out, fmt.Sprintf("books: sub-pool %d holds %d grants, %d cents; the sub-pool confirmed %d, %d cents",
				j, got.Count, got.Cents, s.ConfirmedCount, s.ConfirmedCents))
		}
		delete(totals, j)
	}
	for j, got := range totals {
		out = append(out, fmt.Sprintf("books: %d grants, %d cents of sub-pool %d, which the pool does not have", got.Count, got.Cents, j))
	}
	return out
}

// unseal opens again the sub-pools owner sealed (an ended sub-pool answers
// grabs ended sealed or not; one a concurrent close sealed stays sealed for
// it: lua.Unseal opens only the owner's own seal).
func (c *Catalog) unseal(ctx context.Context, p *rain.Pool, owner string, seals []lua.Sealed) {
	for j, s := range seals {
		if !s.OK {
			continue
		}
		k := p.SubPool(j).Keys()
		if _, err := lua.Unseal(ctx, c.client(p, j), &k, owner); err != nil {
			c.log.Error("a close that could not finish left a sub-pool sealed: it answers grabs ended; run the close again",
				"pool_id", p.ID(), "sub_pool", j, "err", err)
		}
	}
}

// account is the final account of the sealed pool p.
func account(p *rain.Pool, seals []lua.Sealed) *rain.Account {
	a := &rain.Account{PoolID: p.ID(), State: string(rain.Closing), ClosedAt: time.Now().UTC().Truncate(time.Millisecond),
		SubPools: make([]rain.SubPoolAccount, len(seals))}
	for j, s := range seals {
		a.PreloadedCount += s.Count
		a.PreloadedCents += s.Cents
		a.ConfirmedCount += s.ConfirmedCount
		a.ConfirmedCents += s.ConfirmedCents
		a.UnclaimedCount += s.StockCount
		a.UnclaimedCents += s.StockCents
		a.SubPools[j] = rain.SubPoolAccount{Index: j, ConfirmedCount: s.ConfirmedCount, ConfirmedCents: s.ConfirmedCents,
			UnclaimedCount: s.StockCount, UnclaimedCents: s.StockCents}
	}
	return a
}

// writeRecord moves the record on to p's state and account on every shard,
// the serial shard first (what is stored there decides); a copy that is
// missing or partial is written whole, and none goes back (lua.PutRecord).
func (c *Catalog) writeRecord(ctx context.Context, p *record) error {
	_, err := c.moveRecord(ctx, p)
	return err
}

// moveRecord is writeRecord, and says whether this call moved the record
// on to p's state on the serial shard (which decides; of concurrent calls,
// one).
func (c *Catalog) moveRecord(ctx context.Context, p *record) (moved bool, err error) {
	f := p.fields()
	names := append([]string{c.serial}, c.shards.Names()...)
	for i, name := range names {
		if i > 0 && name == c.serial {
			continue
		}
		_, m, err := lua.PutRecord(ctx, c.shards.Client(name), recordKey(p.ID()), f)
		if err != nil {
			return false, rain.Errorf(rain.ErrUnavailable, err, "shard %s: write the record of %s", name, p.ID())
		}
		if i == 0 {
			moved = m
		}
	}
	return moved, nil
}

// free retires every sub-pool (lua.Retire): its keys unlinked (UNLINK frees
// a big value in the background, so it costs its shard microseconds
// whatever the sub-pool's size), its meta left as a tombstone that no late
// step writes past. A close that dies midway is resumed from the record's
// state, closing, and retires again.
func (c *Catalog) free(ctx context.Context, p *rain.Pool) error {
	var errs []error
	for j := range p.SubPools() {
		ok, state, err := lua.Retire(ctx, c.client(p, j), p.SubPool(j))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("sub-pool %d: %w", j, err))
		case !ok:
			// Its account is recorded, yet it can move: never freed.
			return fmt.Errorf("%w: pool %s sub-pool %d is %s, not sealed: its keys are kept; the account recorded may not hold",
				rain.ErrNotNow, p.ID(), j, state)
		default:
			// Out of its shard's due index too (best effort: the reaper
			// drops a closed pool's sub-pool at its next look anyway).
			meta := p.SubPool(j).Keys().Meta
			pipe := c.client(p, j).Pipeline()
			pipe.ZRem(ctx, lua.DueAt, meta)
			pipe.HDel(ctx, lua.DueGen, meta)
			_, _ = pipe.Exec(ctx)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return rain.Errorf(rain.ErrUnavailable, err, "free the keys of %s (run the close again)", p.ID())
	}
	return nil
}
