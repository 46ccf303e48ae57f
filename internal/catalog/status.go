package catalog

// This file is what operators and settlement read of a pool: its status,
// its sub-pools, and the confirm of one of its grants.

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"rain/internal/lua"
)

// Status is a pool's state for operators (GET /admin/pools/{id}).
type Status struct {
	PoolID         string          `json:"pool_id"`
	State          string          `json:"state"`
	TotalCents     int64           `json:"total_cents"`
	Count          int64           `json:"count"`
	RemainingCount int64           `json:"remaining_count"`
	RemainingCents int64           `json:"remaining_cents"`
	HeldCount      int64           `json:"held_count"`
	HeldCents      int64           `json:"held_cents"`
	ConfirmedCount int64           `json:"confirmed_count"`
	ConfirmedCents int64           `json:"confirmed_cents"`
	ReleasedCount  int64           `json:"released_count"`
	ReleasedCents  int64           `json:"released_cents"`
	SubPools       []SubPoolStatus `json:"sub_pools"`
	Spec           Spec            `json:"spec"`
}

// SubPoolStatus is one sub-pool's share of a Status.
type SubPoolStatus struct {
	Index          int    `json:"index"`
	Shard          string `json:"shard"`
	State          string `json:"state"`
	Count          int64  `json:"count"`       // packets loaded into it
	TotalCents     int64  `json:"total_cents"` // cents loaded into it
	RemainingCount int64  `json:"remaining_count"`
	RemainingCents int64  `json:"remaining_cents"`
}

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

// Status reads the pool's counters from every sub-pool.
func (c *Catalog) Status(ctx context.Context, id string) (*Status, error) {
	p, err := c.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	st := &Status{PoolID: id, State: string(p.State), TotalCents: p.Spec.TotalCents, Count: p.Spec.Count,
		Spec: p.Spec, SubPools: []SubPoolStatus{}}
	for j, name := range p.Placement {
		client := c.shards.Client(name)
		if client == nil {
			return nil, fmt.Errorf("%w: sub-pool %d is on shard %s, which is not configured", ErrUnavailable, j, name)
		}
		var n subPoolCounters
		if err := client.HMGet(ctx, p.SubPool(j).Keys().Meta, statusFields...).Scan(&n); err != nil {
			return nil, fmt.Errorf("%w: shard %s: %w", ErrUnavailable, name, err)
		}
		if n.State == "" {
			n.State = "missing"
		}
		st.SubPools = append(st.SubPools, SubPoolStatus{Index: j, Shard: name, State: n.State,
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
	return st, nil
}

// SubPoolRef names a sub-pool and the shard that holds it.
type SubPoolRef struct {
	lua.SubPool
	Shard string
}

// SubPools lists the sub-pools of every pool the shards' registries know,
// with their shards: what settlement reads the outboxes of. Pools that
// cannot be read now (a shard down, or one not configured here) are left
// out and their errors returned, joined, beside the others.
func (c *Catalog) SubPools(ctx context.Context) ([]SubPoolRef, error) {
	ids, err := c.Listed(ctx)
	if err != nil {
		return nil, err
	}
	var out []SubPoolRef
	var errs []error
	for _, id := range ids {
		p, err := c.Pool(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err) // skip it now, list the others
			continue
		}
		for j, name := range p.Placement {
			out = append(out, SubPoolRef{SubPool: p.SubPool(j), Shard: name})
		}
	}
	return out, errors.Join(errs...)
}

// Confirm marks the user's held grant with serial as confirmed: settlement
// has paid it, and it will never be released. Confirming a confirmed grant
// again succeeds. It returns ErrNotFound for an unknown pool, ErrNoGrant,
// ErrGrantReleased or ErrSerialMismatch.
func (c *Catalog) Confirm(ctx context.Context, poolID, userID string, serial int64) error {
	p, err := c.Pool(ctx, poolID)
	if err != nil {
		return err
	}
	j := p.Home(userID)
	k := p.SubPool(j).Keys()
	res, err := lua.Confirm(ctx, c.client(p, j), &k, userID, serial)
	if err != nil {
		return fmt.Errorf("%w: confirm %s sub-pool %d: %w", ErrUnavailable, poolID, j, err)
	}
	return confirmErr(res)
}

// confirmErr maps a confirm script result to Confirm's errors.
func confirmErr(res lua.Confirmation) error {
	switch res {
	case lua.Confirmed, lua.AlreadyConfirmed:
		return nil
	case lua.WasReleased:
		return ErrGrantReleased
	case lua.SerialMismatch:
		return ErrSerialMismatch
	default:
		return ErrNoGrant
	}
}
