package catalog

// This file is what operators and settlement read of a pool: its status,
// its sub-pools, and the confirm of one of its grants.

import (
	"context"
	"errors"
	"reflect"
	"slices"

	"rain"
	"rain/internal/lua"
)

// subPoolCounters is what Status reads of a sub-pool's meta hash.
type subPoolCounters struct {
	State          string `redis:"state"`
	Count          int64  `redis:"count"`
	Cents          int64  `redis:"cents"`
	StockCount     int64  `redis:"stock_count"`
	StockCents     int64  `redis:"stock_cents"`
	HeldCount      int64  `redis:"held_count"`
	HeldCents      int64  `redis:"held_cents"`
	ConfirmedCount int64  `redis:"confirmed_count"`
	ConfirmedCents int64  `redis:"confirmed_cents"`
	ReleasedCount  int64  `redis:"released_count"`
	ReleasedCents  int64  `redis:"released_cents"`
	EndsMS         int64  `redis:"ends_ms"`
	Ended          string `redis:"ended"` // "1" once its end was seen: see end.lua
}

// statusFields are subPoolCounters' redis tags, the fields HMGET asks for.
var statusFields = func() []string {
	t := reflect.TypeFor[subPoolCounters]()
	out := make([]string, t.NumField())
	for i := range out {
		out[i] = t.Field(i).Tag.Get("redis")
	}
	return out
}()

// Status reads the pool's counters from every sub-pool. A sub-pool whose
// window is over (by its shard's clock) is "ended", and the pool is when
// every one is. A closed pool's status is its account (Status.Account).
func (c *Catalog) Status(ctx context.Context, id string) (*rain.Status, error) {
	p, err := c.Read(ctx, id)
	if err != nil {
		return nil, err
	}
	if p.State.Over() {
		return &rain.Status{PoolID: id, State: string(p.State), Account: p.Account}, nil
	}
	st := &rain.Status{PoolID: id, State: string(p.State), TotalCents: p.Spec.TotalCents, Count: p.Spec.Count,
		Spec: p.Spec, SubPools: []rain.SubPoolStatus{}}
	ended := p.State == rain.Open
	for j, name := range p.Placement {
		n, err := c.subPoolCounters(ctx, p, j)
		if err != nil {
			return nil, err
		}
		if n.State != string(rain.Open) {
			ended = false
		}
		if n.State == string(rain.Open) && (n.Ended == "1" || n.EndsMS > 0 && n.EndsMS <= n.now) {
			n.State = "ended"
		} else {
			ended = false
		}
		st.SubPools = append(st.SubPools, rain.SubPoolStatus{Index: j, Shard: name, State: n.State,
			Count: n.Count, TotalCents: n.Cents, RemainingCount: n.StockCount, RemainingCents: n.StockCents})
		st.RemainingCount += n.StockCount
		st.RemainingCents += n.StockCents
		st.HeldCount += n.HeldCount
		st.HeldCents += n.HeldCents
		st.ConfirmedCount += n.ConfirmedCount
		st.ConfirmedCents += n.ConfirmedCents
		st.ReleasedCount += n.ReleasedCount
		st.ReleasedCents += n.ReleasedCents
	}
	if ended {
		st.State = "ended"
	}
	return st, nil
}

// counters is a sub-pool's counters and its shard's clock (ms).
type counters struct {
	subPoolCounters
	now int64
}

// subPoolCounters reads sub-pool j's counters and its shard's clock, in one
// round trip.
func (c *Catalog) subPoolCounters(ctx context.Context, p *rain.Pool, j int) (counters, error) {
	name := p.Placement[j]
	client := c.shards.Client(name)
	if client == nil {
		return counters{}, rain.Errorf(rain.ErrUnavailable, nil, "sub-pool %d is on shard %s, which is not configured", j, name)
	}
	pipe := client.Pipeline()
	meta := pipe.HMGet(ctx, p.SubPool(j).Keys().Meta, statusFields...)
	clock := pipe.Time(ctx)
	var n counters
	if _, err := pipe.Exec(ctx); err != nil {
		return n, rain.Errorf(rain.ErrUnavailable, err, "shard %s did not answer", name)
	}
	if err := meta.Scan(&n.subPoolCounters); err != nil {
		return n, rain.Errorf(rain.ErrUnavailable, err, "shard %s did not answer", name)
	}
	n.now = clock.Val().UnixMilli()
	if n.State == "" {
		n.State = "missing"
	}
	return n, nil
}

// SubPools lists the sub-pools of every pool the shards' registries know,
// with their shards: what settlement reads the outboxes of. Pools that
// cannot be read now (a shard down) are left out, and so are sub-pools
// placed on a shard not configured here; their errors (ErrUnavailable for
// a shard not configured) are returned, joined, beside the others. It goes
// through CachedList and Cached: Redis is read only where they would.
func (c *Catalog) SubPools(ctx context.Context) ([]rain.SubPoolRef, error) {
	ids, err := c.CachedList(ctx)
	if err != nil {
		return nil, err
	}
	var out []rain.SubPoolRef
	var errs []error
	for _, id := range ids {
		p, err := c.Cached(ctx, id)
		if errors.Is(err, rain.ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err) // skip it now, list the others
			continue
		}
		if p.State.Over() {
			continue // its keys are freed, or being freed
		}
		if err := c.placed(p); err != nil {
			errs = append(errs, err) // the sub-pools on the shards configured here are listed
		}
		for j, name := range p.Placement {
			if c.shards.Client(name) != nil {
				out = append(out, rain.SubPoolRef{SubPool: p.SubPool(j), Shard: name})
			}
		}
	}
	return out, errors.Join(errs...)
}

// Confirm marks the user's held grant with serial as confirmed: settlement
// has paid it, and it will never be released. Confirming a confirmed grant
// again succeeds, after the pool's close too (API.md: idempotent), when
// its keys are freed: the books (Config.Books) answer then, which hold
// every grant the pool's settlement delivered. It returns ErrNotFound for
// an unknown pool, ErrNoGrant, ErrGrantReleased or ErrSerialMismatch.
func (c *Catalog) Confirm(ctx context.Context, poolID, userID string, serial int64) error {
	p, err := c.Cached(ctx, poolID)
	if err != nil {
		return err
	}
	j := p.Home(userID)
	k := p.SubPool(j).Keys()
	res, err := lua.Confirm(ctx, c.client(p, j), &k, userID, serial)
	if err != nil {
		return rain.Errorf(rain.ErrUnavailable, err, "confirm %s sub-pool %d: shard %s did not answer", poolID, j, p.Placement[j])
	}
	if res == lua.UnknownGrant && !p.State.Over() {
		// The cached record may predate a close by another process.
		if fresh, err := c.Read(ctx, poolID); err == nil {
			p = fresh
		}
	}
	if res == lua.UnknownGrant && p.State.Over() {
		return c.confirmClosed(ctx, poolID, userID, serial)
	}
	return confirmErr(res)
}

// confirmClosed answers the confirm of a grant of a closed (or closing)
// pool whose sub-pool's keys are freed, from the books: confirmed when
// they hold the grant paid, released when they hold it released at its
// deadline, a serial mismatch when they hold another of the user's. A
// grant they do not hold was never confirmed (a close waits for settlement
// to deliver every confirmed grant): unknown, as one released at its
// deadline is when settlement did not record it (a sink other than the
// database). Without books nothing holds the pool's grants any more:
// unknown, saying so.
func (c *Catalog) confirmClosed(ctx context.Context, poolID, userID string, serial int64) error {
	if c.books == nil {
		return rain.Errorf(rain.ErrNoGrant, nil, "pool %s is closed and its grants' records are freed; with no database (--postgres) nothing holds them any more", poolID)
	}
	paid, released, err := c.books.Settled(ctx, poolID, userID)
	if err != nil {
		return rain.Errorf(rain.ErrUnavailable, err, "confirm %s: the database did not answer", poolID)
	}
	switch {
	case slices.Contains(paid, serial):
		return nil
	case slices.Contains(released, serial):
		return rain.ErrGrantReleased
	case len(paid)+len(released) > 0:
		return rain.ErrSerialMismatch
	}
	return rain.ErrNoGrant
}

// confirmErr maps a confirm script result to Confirm's errors.
func confirmErr(res lua.Confirmation) error {
	switch res {
	case lua.Confirmed, lua.AlreadyConfirmed:
		return nil
	case lua.WasReleased:
		return rain.ErrGrantReleased
	case lua.SerialMismatch:
		return rain.ErrSerialMismatch
	default:
		return rain.ErrNoGrant
	}
}
