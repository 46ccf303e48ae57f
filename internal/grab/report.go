package grab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"

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
		var n subPoolCounters
		if err := c.HMGet(ctx, lua.SubPool{Pool: id, Index: j}.Keys().Meta, statusFields...).Scan(&n); err != nil {
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

// Report is the conservation check of one pool (GET /admin/pools/{id}/audit).
type Report struct {
	PoolID   string    `json:"pool_id"`
	OK       bool      `json:"ok"`
	Problems []Problem `json:"problems"`
	// Notes say what the audit could not check, and why (a sub-pool that
	// kept changing during its recount): not problems.
	Notes []string `json:"notes,omitempty"`
}

// Problem is one difference the audit found. SubPool is nil for a problem of
// the whole pool; Token names the spill a problem of a transfer is about.
type Problem struct {
	SubPool  *int   `json:"sub_pool,omitempty"`
	Shard    string `json:"shard,omitempty"`
	Token    string `json:"token,omitempty"`
	Quantity string `json:"quantity"`
	Expected int64  `json:"expected"`
	Found    int64  `json:"found"`
}

func (p Problem) String() string {
	where := "pool"
	if p.SubPool != nil {
		where = fmt.Sprintf("sub-pool %d on %s", *p.SubPool, p.Shard)
	}
	if p.Token != "" {
		where += " spill token " + p.Token
	}
	return fmt.Sprintf("%s: %s expected %d, found %d", where, p.Quantity, p.Expected, p.Found)
}

// Audit checks conservation, in count and in cents.
//
// Per sub-pool, from one atomic read in constant time: count + received -
// sent = stock + held + confirmed + in flight by the counters, the stock
// list's length, the deadline index and the transfers in flight agree with
// them. Then the records are recounted in bounded pages (no call holds a
// shard for more than a few milliseconds, whatever the pool's size): the
// stock's sum, the grants by state, the acked transfers and the adopted
// verdicts agree with the counters, and no serial appears twice; a recount
// is compared only when the sub-pool did not change while it was read (a
// version every money move bumps), else it is noted and not counted as a
// problem.
//
// Across sub-pools, spill by spill: every transfer a sibling acked was
// adopted by its home from that sibling with that amount; no transfer a
// sibling put back was adopted; every adopted token has its transfer. With
// the per-sub-pool equations this is conservation of the pool: nothing
// created or lost between sub-pools. Sub-pools are read one after another
// on a live pool, but a spill's records only ever move forward (in flight,
// then acked or untaken; undecided, then adopted or refused), so a token
// that looks wrong is read again on both sides before it is reported: a
// spill that moved between the reads is not a false alarm, and a real
// mismatch is pinned to its token. And the sub-pools add up to the spec.
func (s *Service) Audit(ctx context.Context, id string) (*Report, error) {
	rec, err := s.findRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	r := &Report{PoolID: id, Problems: []Problem{}}
	subs := make([]lua.SubPoolAudit, len(rec.placement))
	for j, name := range rec.placement {
		c := s.shards.Client(name)
		if c == nil {
			return nil, fmt.Errorf("%w: sub-pool %d is on shard %s, which is not configured", ErrUnavailable, j, name)
		}
		if subs[j], err = lua.AuditSubPool(ctx, c, lua.SubPool{Pool: id, Index: j}); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	var count, cents int64
	for j, a := range subs {
		name := rec.placement[j]
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
		// Read with the counters, atomically: these hold on a live pool.
		add("stock_count (list length)", a.StockCount, a.ListLen)
		add("deadline index entries (held_count)", a.HeldCount, a.DeadlineEntries)
		add("inflight_count (transfers)", a.InflightCount, a.Transfers)
		add("inflight_cents (transfers)", a.InflightCents, a.TransfersCents)
		if a.State == stateOpen {
			add("count + received - sent = stock + held + confirmed + in flight (counters)",
				a.Count+a.ReceivedCount-a.SentCount, a.StockCount+a.HeldCount+a.ConfirmedCount+a.InflightCount)
			add("cents + received - sent = stock + held + confirmed + in flight (counters)",
				a.Cents+a.ReceivedCents-a.SentCents, a.StockCents+a.HeldCents+a.ConfirmedCents+a.InflightCents)
		}
		add("unreadable grant or spill records", 0, a.BadRecords)
		if !a.Recounted {
			r.Notes = append(r.Notes, fmt.Sprintf("sub-pool %d on %s changed during every recount: its records were not recounted (its counters were checked)", j, name))
		} else {
			// Read in pages while nothing moved: the records agree with
			// the counters.
			add("stock_cents (list sum)", a.StockCents, a.ListSum)
			add("held_count (grants)", a.HeldCount, a.GrantsHeld)
			add("held_cents (grants)", a.HeldCents, a.GrantsHeldCents)
			add("confirmed_count (grants)", a.ConfirmedCount, a.GrantsConfirmed)
			add("confirmed_cents (grants)", a.ConfirmedCents, a.GrantsConfirmedCents)
			// A released user may grab again, which replaces the released
			// record: the counters count every release, the records only
			// those not grabbed again.
			if a.ReleasedCount < a.GrantsReleased {
				add("released_count (at least the released grant records)", a.GrantsReleased, a.ReleasedCount)
			}
			if a.ReleasedCents < a.GrantsReleasedCents {
				add("released_cents (at least the released grant records)", a.GrantsReleasedCents, a.ReleasedCents)
			}
			add("duplicate serials", 0, a.DuplicateSerials)
			add("sent_count (acked transfers)", a.SentCount, a.Acked)
			add("sent_cents (acked transfers)", a.SentCents, a.AckedCents)
			add("received_count (adopted verdicts)", a.ReceivedCount, a.Adopted)
			add("received_cents (adopted verdicts)", a.ReceivedCents, a.AdoptedCents)
		}
	}
	if rec.state == stateOpen {
		whole := func(q string, want, got int64) {
			if want != got {
				r.Problems = append(r.Problems, Problem{Quantity: q, Expected: want, Found: got})
			}
		}
		whole("count (sum of sub-pools)", rec.spec.Count, count)
		whole("total_cents (sum of sub-pools)", rec.spec.TotalCents, cents)
	}
	spills, err := s.auditSpills(ctx, id, rec, subs)
	if err != nil {
		return nil, err
	}
	r.Problems = append(r.Problems, spills...)
	r.OK = len(r.Problems) == 0
	return r, nil
}

// spillSide is what one sub-pool says of one spill token.
type spillSide struct {
	transfer *lua.TransferRecord // at the sibling: in flight or settled; nil if none
	verdict  *lua.Verdict        // at the home; nil if undecided
}

// auditSpills matches every spill token across its two sub-pools (see
// Audit). Tokens that look wrong are read again, both sides, before they
// are reported.
func (s *Service) auditSpills(ctx context.Context, id string, rec *record, subs []lua.SubPoolAudit) ([]Problem, error) {
	type key struct {
		token        string
		home, origin int
	}
	var suspects []key
	seen := map[key]bool{}
	suspect := func(k key) {
		if !seen[k] {
			seen[k] = true
			suspects = append(suspects, k)
		}
	}
	transfer := func(j int, token string) *lua.TransferRecord {
		if j < 0 || j >= len(subs) {
			return nil
		}
		if v, ok := subs[j].TransferRecords[token]; ok {
			t, err := lua.ParseTransfer(v, false)
			if err == nil {
				return &t
			}
		}
		if v, ok := subs[j].SettledRecords[token]; ok {
			t, err := lua.ParseTransfer(v, true)
			if err == nil {
				return &t
			}
		}
		return nil
	}
	verdict := func(h int, token string) *lua.Verdict {
		if h < 0 || h >= len(subs) {
			return nil
		}
		if v, ok := subs[h].VerdictRecords[token]; ok {
			if vd, err := lua.ParseVerdict(v); err == nil {
				return &vd
			}
		}
		return nil
	}
	for j, a := range subs {
		for _, m := range []map[string]string{a.TransferRecords, a.SettledRecords} {
			for token := range m {
				t := transfer(j, token)
				if t == nil {
					continue // unreadable: counted in bad_records
				}
				if spillProblem(j, t, verdict(t.Home, token)) != "" {
					suspect(key{token, t.Home, j})
				}
			}
		}
		for token, v := range a.VerdictRecords {
			vd, err := lua.ParseVerdict(v)
			if err != nil || !vd.Adopted {
				continue
			}
			if spillProblem(vd.Origin, transfer(vd.Origin, token), &vd) != "" {
				suspect(key{token, j, vd.Origin})
			}
		}
	}
	var problems []Problem
	for _, k := range suspects {
		side, err := s.readSpill(ctx, id, rec, k.token, k.home, k.origin)
		if err != nil {
			return nil, err
		}
		if q := spillProblem(k.origin, side.transfer, side.verdict); q != "" {
			origin := k.origin
			p := Problem{SubPool: &origin, Shard: rec.placement[origin], Token: k.token, Quantity: q}
			if side.transfer != nil {
				p.Found = side.transfer.Amount
			}
			if side.verdict != nil {
				p.Expected = side.verdict.Amount
			}
			problems = append(problems, p)
		}
	}
	return problems, nil
}

// spillProblem says what is wrong with a spill token whose transfer out of
// sibling j is t (nil: none) and whose verdict at its home is v (nil:
// undecided); "" when nothing is.
func spillProblem(j int, t *lua.TransferRecord, v *lua.Verdict) string {
	adoptedHere := v != nil && v.Adopted && v.Origin == j
	switch {
	case t == nil && adoptedHere:
		return "adopted at its home with no transfer out of this sibling: created"
	case t == nil:
		return ""
	case adoptedHere && v.Amount != t.Amount:
		return "adopted at its home with another amount than taken here"
	case t.State == 'a' && !adoptedHere:
		return "acked here but not adopted from here at its home: lost"
	case t.State == 'u' && adoptedHere:
		return "adopted at its home and also put back here: doubled"
	}
	return ""
}

// readSpill reads one token's records again: the transfer at sibling
// origin, then the verdict at home.
func (s *Service) readSpill(ctx context.Context, id string, rec *record, token string, home, origin int) (spillSide, error) {
	var side spillSide
	if origin >= 0 && origin < len(rec.placement) {
		k := lua.SubPool{Pool: id, Index: origin}.Keys()
		c := s.client(rec, origin)
		if v, err := c.HGet(ctx, k.Transfers, token).Result(); err == nil {
			if t, err := lua.ParseTransfer(v, false); err == nil {
				side.transfer = &t
			}
		} else if !errors.Is(err, redis.Nil) {
			return side, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if side.transfer == nil {
			if v, err := c.HGet(ctx, k.Settled, token).Result(); err == nil {
				if t, err := lua.ParseTransfer(v, true); err == nil {
					side.transfer = &t
				}
			} else if !errors.Is(err, redis.Nil) {
				return side, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
		}
	}
	if home >= 0 && home < len(rec.placement) {
		k := lua.SubPool{Pool: id, Index: home}.Keys()
		if v, err := s.client(rec, home).HGet(ctx, k.Verdicts, token).Result(); err == nil {
			if vd, err := lua.ParseVerdict(v); err == nil {
				side.verdict = &vd
			}
		} else if !errors.Is(err, redis.Nil) {
			return side, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	return side, nil
}

// List returns the ids of every pool loaded, sorted: the union of the
// shards' registries, of those that answer when some do not.
func (s *Service) List(ctx context.Context) ([]string, error) {
	ids, _, err := s.poolIDs(ctx)
	if errors.Is(err, errPartial) {
		err = nil
	}
	slices.Sort(ids)
	return ids, err
}

// SubPoolStock is one sub-pool's stock, for metrics.
type SubPoolStock struct {
	Pool           string
	Index          int
	Shard          string
	RemainingCount int64
	RemainingCents int64
}

// Stock reads the stock of every sub-pool of the open pools this instance
// serves (one HMGET per sub-pool, pipelined per shard, the shards at once);
// a shard whose breaker is open is not asked, and one that does not answer
// within ctx leaves its sub-pools out. It is what a metrics scrape reads: a
// frozen shard costs the scrape ctx's bound at most, once (its breaker
// opens on the claims meanwhile).
func (s *Service) Stock(ctx context.Context) []SubPoolStock {
	s.mu.RLock()
	views := make(map[string]*poolView, len(s.pools))
	maps.Copy(views, s.pools)
	s.mu.RUnlock()
	type read struct {
		st  SubPoolStock
		cmd *redis.SliceCmd
	}
	pipes := map[*batcher]redis.Pipeliner{}
	var reads []read
	for id, p := range views {
		for j, b := range p.batchers {
			if b.br.current() != breakerClosed {
				continue
			}
			pipe := pipes[b]
			if pipe == nil {
				pipe = b.c.Pipeline()
				pipes[b] = pipe
			}
			cmd := pipe.HMGet(ctx, p.keys[j].Meta, "stock_count", "stock_cents")
			reads = append(reads, read{SubPoolStock{Pool: id, Index: j, Shard: p.rec.placement[j]}, cmd})
		}
	}
	var wg sync.WaitGroup
	for _, pipe := range pipes {
		wg.Go(func() { _, _ = pipe.Exec(ctx) }) // errors are per command, read below
	}
	wg.Wait()
	var out []SubPoolStock
	for _, r := range reads {
		var n struct {
			Count int64 `redis:"stock_count"`
			Cents int64 `redis:"stock_cents"`
		}
		if r.cmd.Err() != nil || r.cmd.Scan(&n) != nil {
			continue
		}
		r.st.RemainingCount, r.st.RemainingCents = n.Count, n.Cents
		out = append(out, r.st)
	}
	return out
}
