package grab

import (
	"context"
	"fmt"
	"strconv"

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
	RemainingCount int64  `json:"remaining_count"`
	RemainingCents int64  `json:"remaining_cents"`
}

var statusFields = []string{"state", "stock_count", "stock_cents", "held_count", "held_cents",
	"confirmed_count", "confirmed_cents", "released_count", "released_cents"}

// Status reads the pool's counters from every sub-pool.
func (s *Service) Status(ctx context.Context, id string) (*Status, error) {
	rec, err := s.findRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	st := &Status{PoolID: id, State: rec.state, TotalCents: rec.spec.TotalCents, Count: rec.spec.Count,
		Spec: rec.spec, SubPools: []SubPoolStatus{}}
	for j, name := range rec.placement {
		c := s.shards.Client(name)
		if c == nil {
			return nil, fmt.Errorf("%w: sub-pool %d is on shard %s, which is not configured", ErrUnavailable, j, name)
		}
		v, err := c.HMGet(ctx, lua.SubPool{Pool: id, Index: j}.Keys().Meta, statusFields...).Result()
		if err != nil {
			return nil, fmt.Errorf("%w: shard %s: %w", ErrUnavailable, name, err)
		}
		n := func(i int) int64 {
			str, _ := v[i].(string)
			x, _ := strconv.ParseInt(str, 10, 64)
			return x
		}
		state, _ := v[0].(string)
		if state == "" {
			state = "missing"
		}
		st.SubPools = append(st.SubPools, SubPoolStatus{Index: j, Shard: name, State: state,
			RemainingCount: n(1), RemainingCents: n(2)})
		st.RemainingCount += n(1)
		st.RemainingCents += n(2)
		st.HeldCount += n(3)
		st.HeldCents += n(4)
		st.ConfirmedCount += n(5)
		st.ConfirmedCents += n(6)
		st.ReleasedCount += n(7)
		st.ReleasedCents += n(8)
	}
	return st, nil
}

// Report is the conservation check of one pool (GET /admin/pools/{id}/audit).
type Report struct {
	PoolID   string    `json:"pool_id"`
	OK       bool      `json:"ok"`
	Problems []Problem `json:"problems"`
}

// Problem is one difference the audit found. SubPool is nil for a problem of
// the whole pool.
type Problem struct {
	SubPool  *int   `json:"sub_pool,omitempty"`
	Shard    string `json:"shard,omitempty"`
	Quantity string `json:"quantity"`
	Expected int64  `json:"expected"`
	Found    int64  `json:"found"`
}

func (p Problem) String() string {
	where := "pool"
	if p.SubPool != nil {
		where = fmt.Sprintf("sub-pool %d on %s", *p.SubPool, p.Shard)
	}
	return fmt.Sprintf("%s: %s expected %d, found %d", where, p.Quantity, p.Expected, p.Found)
}

// Audit checks conservation, in count and in cents, for every sub-pool and the
// pool: stock left + held + confirmed (+ what moved between sub-pools and
// what is in flight) = preloaded; the counters agree with a
// recount of the stock and the grants; every held grant is indexed by its
// deadline; no serial appears twice; the sub-pools add up to the spec.
// Each sub-pool is read atomically (one script), so a live pool audits
// consistently sub-pool by sub-pool.
func (s *Service) Audit(ctx context.Context, id string) (*Report, error) {
	rec, err := s.findRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	r := &Report{PoolID: id, Problems: []Problem{}}
	var count, cents int64
	// Spills between sub-pools: received and sent are what moved and was
	// acknowledged; in flight what left a sibling and is not acknowledged.
	var recvN, recvC, sentN, sentC, flightN, flightC int64
	for j, name := range rec.placement {
		c := s.shards.Client(name)
		if c == nil {
			return nil, fmt.Errorf("%w: sub-pool %d is on shard %s, which is not configured", ErrUnavailable, j, name)
		}
		a, err := lua.AuditSubPool(ctx, c, lua.SubPool{Pool: id, Index: j})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		add := func(q string, want, got int64) {
			if want != got {
				r.Problems = append(r.Problems, Problem{SubPool: &j, Shard: name, Quantity: q, Expected: want, Found: got})
			}
		}
		if !a.Found {
			add("sub_pool_exists", 1, 0)
			continue
		}
		count += a.Count
		cents += a.Cents
		if rec.state == stateOpen && a.State != stateOpen {
			add("open", 1, 0)
		}
		add("stock_count (list length)", a.StockCount, a.ListLen)
		add("stock_cents (list sum)", a.StockCents, a.ListSum)
		add("held_count (grants)", a.HeldCount, a.GrantsHeld)
		add("held_cents (grants)", a.HeldCents, a.GrantsHeldCents)
		add("confirmed_count (grants)", a.ConfirmedCount, a.GrantsConfirmed)
		add("confirmed_cents (grants)", a.ConfirmedCents, a.GrantsConfirmedCents)
		add("deadline index entries", a.GrantsHeld, a.Deadlines)
		add("duplicate serials", 0, a.DuplicateSerials)
		add("unreadable grant records", 0, a.BadRecords)
		add("inflight_count (transfers)", a.InflightCount, a.Transfers)
		add("inflight_cents (transfers)", a.InflightCents, a.TransfersCents)
		if a.State == stateOpen {
			add("count + received - sent = stock + held + confirmed + in flight",
				a.Count+a.ReceivedCount-a.SentCount, a.ListLen+a.GrantsHeld+a.GrantsConfirmed+a.Transfers)
			add("cents + received - sent = stock + held + confirmed + in flight",
				a.Cents+a.ReceivedCents-a.SentCents, a.ListSum+a.GrantsHeldCents+a.GrantsConfirmedCents+a.TransfersCents)
		}
		recvN, recvC, sentN, sentC = recvN+a.ReceivedCount, recvC+a.ReceivedCents, sentN+a.SentCount, sentC+a.SentCents
		flightN, flightC = flightN+a.Transfers, flightC+a.TransfersCents
	}
	if rec.state == stateOpen {
		whole := func(q string, want, got int64) {
			if want != got {
				r.Problems = append(r.Problems, Problem{Quantity: q, Expected: want, Found: got})
			}
		}
		whole("count (sum of sub-pools)", rec.spec.Count, count)
		whole("total_cents (sum of sub-pools)", rec.spec.TotalCents, cents)
		// Everything received was sent, or is still in flight (adopted at
		// the home, not yet acknowledged at the sibling): nothing created,
		// nothing lost between sub-pools.
		if d := recvN - sentN; d < 0 || d > flightN {
			r.Problems = append(r.Problems, Problem{Quantity: "received - sent packets within [0, in flight]", Expected: flightN, Found: d})
		}
		if d := recvC - sentC; d < 0 || d > flightC {
			r.Problems = append(r.Problems, Problem{Quantity: "received - sent cents within [0, in flight]", Expected: flightC, Found: d})
		}
	}
	r.OK = len(r.Problems) == 0
	return r, nil
}
