package catalog

// This file is the audit: conservation of a pool, in count and in cents,
// sub-pool by sub-pool and spill by spill.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/lua"
)

// Audit checks conservation, in count and in cents.
//
// Per sub-pool, from one atomic read in constant time: count + received -
// sent = stock + held + confirmed + in flight by the counters, the stock
// list's length and the transfers in flight agree with them, and the
// deadline index names at least as many users as grants are held. Then
// the records are recounted in bounded pages (no call holds a shard for
// more than a few milliseconds, whatever the pool's size): the stock's
// sum, the grants by state, the acked transfers and the adopted verdicts
// agree with the counters, every held grant is named by the deadline index
// under its deadline, and no serial appears twice; a recount
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
func (c *Catalog) Audit(ctx context.Context, id string) (*rain.Report, error) {
	p, err := c.Read(ctx, id)
	if err != nil {
		return nil, err
	}
	if p.State.Over() {
		return auditAccount(p), nil
	}
	r := &rain.Report{PoolID: id, Problems: []rain.Problem{}}
	subs := make([]lua.SubPoolAudit, len(p.Placement))
	for j, name := range p.Placement {
		client := c.shards.Client(name)
		if client == nil {
			return nil, rain.Errorf(rain.ErrUnavailable, nil, "sub-pool %d is on shard %s, which is not configured", j, name)
		}
		if subs[j], err = lua.AuditSubPool(ctx, client, p.SubPool(j)); err != nil {
			return nil, rain.Errorf(rain.ErrUnavailable, err, "audit %s sub-pool %d: shard %s did not answer", id, j, name)
		}
	}
	var count, cents int64
	for j, a := range subs {
		checkSubPool(r, j, p.Placement[j], p.State, &a)
		count += a.Count
		cents += a.Cents
	}
	if p.State == rain.Open {
		whole := func(q string, want, got int64) {
			if want != got {
				r.Problems = append(r.Problems, rain.Problem{Quantity: q, Expected: want, Found: got})
			}
		}
		whole("count (sum of sub-pools)", p.Spec.Count, count)
		whole("total_cents (sum of sub-pools)", p.Spec.TotalCents, cents)
	}
	spills, err := c.auditSpills(ctx, id, p, subs)
	if err != nil {
		return nil, err
	}
	r.Problems = append(r.Problems, spills...)
	r.OK = len(r.Problems) == 0
	return r, nil
}

// auditAccount is the audit of a pool whose life is over, from its account:
// its keys are freed (or being freed), and the account was recorded when
// the audit of its sub-pools was ok.
func auditAccount(p *rain.Pool) *rain.Report {
	a := p.Account
	r := &rain.Report{PoolID: p.ID(), Problems: []rain.Problem{},
		Notes: []string{fmt.Sprintf("%s %s: answered from its account", p.State, a.ClosedAt.Format(time.RFC3339))}}
	if a.PreloadedCount != a.ConfirmedCount+a.UnclaimedCount {
		r.Problems = append(r.Problems, rain.Problem{Quantity: "preloaded_count = confirmed_count + unclaimed_count (account)",
			Expected: a.PreloadedCount, Found: a.ConfirmedCount + a.UnclaimedCount})
	}
	if a.PreloadedCents != a.ConfirmedCents+a.UnclaimedCents {
		r.Problems = append(r.Problems, rain.Problem{Quantity: "preloaded_cents = confirmed_cents + unclaimed_cents (account)",
			Expected: a.PreloadedCents, Found: a.ConfirmedCents + a.UnclaimedCents})
	}
	if a.PreloadedCount != p.Spec.Count || a.PreloadedCents != p.Spec.TotalCents {
		r.Problems = append(r.Problems, rain.Problem{Quantity: "preloaded_cents (account) = total_cents (spec)",
			Expected: p.Spec.TotalCents, Found: a.PreloadedCents})
	}
	r.OK = len(r.Problems) == 0
	return r
}

// checkSubPool adds to r what is wrong with sub-pool j (on shard name) as
// a read it; state is the pool's.
func checkSubPool(r *rain.Report, j int, name string, state rain.State, a *lua.SubPoolAudit) {
	add := func(q string, want, got int64) {
		if want != got {
			r.Problems = append(r.Problems, rain.Problem{SubPool: &j, Shard: name, Quantity: q, Expected: want, Found: got})
		}
	}
	if !a.Found {
		add("sub_pool_exists", 1, 0)
		return
	}
	live := rain.State(a.State) == rain.Open || rain.State(a.State) == rain.Closing // closing: sealed by a close
	if state == rain.Open && !live {
		add("open", 1, 0)
	}
	// Read with the counters, atomically: these hold on a live pool.
	add("stock_count (list length)", a.StockCount, a.ListLen)
	if a.DeadlineEntries < a.HeldCount {
		// The index names a user per grant held, and a member may name a
		// few more (grants confirmed before its deadline): at least
		// held_count. Which grants it names, the recount checks.
		add("users the deadline index names (held_count at least)", a.HeldCount, a.DeadlineEntries)
	}
	add("inflight_count (transfers)", a.InflightCount, a.Transfers)
	add("inflight_cents (transfers)", a.InflightCents, a.TransfersCents)
	if live {
		add("count + received - sent = stock + held + confirmed + in flight (counters)",
			a.Count+a.ReceivedCount-a.SentCount, a.StockCount+a.HeldCount+a.ConfirmedCount+a.InflightCount)
		add("cents + received - sent = stock + held + confirmed + in flight (counters)",
			a.Cents+a.ReceivedCents-a.SentCents, a.StockCents+a.HeldCents+a.ConfirmedCents+a.InflightCents)
	}
	add("unreadable grant or spill records", 0, a.BadRecords)
	if !a.Recounted {
		r.Notes = append(r.Notes, fmt.Sprintf("sub-pool %d on %s changed during every recount: its records were not recounted (its counters were checked)", j, name))
		return
	}
	// Read in pages while nothing moved: the records agree with the
	// counters.
	add("stock_cents (list sum)", a.StockCents, a.ListSum)
	add("held_count (grants)", a.HeldCount, a.GrantsHeld)
	add("held grants the deadline index does not name", 0, a.Unindexed)
	add("held_cents (grants)", a.HeldCents, a.GrantsHeldCents)
	add("confirmed_count (grants)", a.ConfirmedCount, a.GrantsConfirmed)
	add("confirmed_cents (grants)", a.ConfirmedCents, a.GrantsConfirmedCents)
	// A released user may grab again, which replaces the released record:
	// the counters count every release, the records only those not grabbed
	// again.
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

// spillSide is what one sub-pool says of one spill token.
type spillSide struct {
	transfer *lua.TransferRecord // at the sibling: in flight or resolved; nil if none
	verdict  *lua.Verdict        // at the home; nil if undecided
}

// auditSpills matches every spill token across its two sub-pools (see
// Audit). Tokens that look wrong are read again, both sides, before they
// are reported.
func (c *Catalog) auditSpills(ctx context.Context, id string, p *rain.Pool, subs []lua.SubPoolAudit) ([]rain.Problem, error) {
	var problems []rain.Problem
	for _, k := range spillSuspects(subs) {
		side, err := c.readSpill(ctx, id, p, k.token, k.home, k.origin)
		if err != nil {
			return nil, err
		}
		if q := spillProblem(k.origin, side.transfer, side.verdict); q != "" {
			origin := k.origin
			pr := rain.Problem{SubPool: &origin, Shard: p.Placement[origin], Token: k.token, Quantity: q}
			if side.transfer != nil {
				pr.Found = side.transfer.Amount
			}
			if side.verdict != nil {
				pr.Expected = side.verdict.Amount
			}
			problems = append(problems, pr)
		}
	}
	return problems, nil
}

// spillKey names one spill: its token, its home and the sibling it took
// from.
type spillKey struct {
	token        string
	home, origin int
}

// spillSuspects lists, once each, the spills whose two sides as the
// sub-pools were read disagree (see spillProblem).
func spillSuspects(subs []lua.SubPoolAudit) []spillKey {
	var suspects []spillKey
	seen := map[spillKey]bool{}
	suspect := func(k spillKey) {
		if !seen[k] {
			seen[k] = true
			suspects = append(suspects, k)
		}
	}
	for j, a := range subs {
		for _, m := range []map[string]string{a.TransferRecords, a.ResolvedRecords} {
			for token := range m {
				t := readTransfer(subs, j, token)
				if t == nil {
					continue // unreadable: counted in bad_records
				}
				if spillProblem(j, t, readVerdict(subs, t.Home, token)) != "" {
					suspect(spillKey{token, t.Home, j})
				}
			}
		}
		for token, v := range a.VerdictRecords {
			vd, err := lua.ParseVerdict(v)
			if err != nil || !vd.Adopted {
				continue
			}
			if spillProblem(vd.Origin, readTransfer(subs, vd.Origin, token), &vd) != "" {
				suspect(spillKey{token, j, vd.Origin})
			}
		}
	}
	return suspects
}

// readTransfer is token's transfer out of sub-pool j as the audit read it,
// in flight or resolved; nil if none (or unreadable).
func readTransfer(subs []lua.SubPoolAudit, j int, token string) *lua.TransferRecord {
	if j < 0 || j >= len(subs) {
		return nil
	}
	if v, ok := subs[j].TransferRecords[token]; ok {
		if t, err := lua.ParseTransfer(v, false); err == nil {
			return &t
		}
	}
	if v, ok := subs[j].ResolvedRecords[token]; ok {
		if t, err := lua.ParseTransfer(v, true); err == nil {
			return &t
		}
	}
	return nil
}

// readVerdict is home h's verdict on token as the audit read it; nil if
// undecided (or unreadable).
func readVerdict(subs []lua.SubPoolAudit, h int, token string) *lua.Verdict {
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
func (c *Catalog) readSpill(ctx context.Context, id string, p *rain.Pool, token string, home, origin int) (spillSide, error) {
	var side spillSide
	if origin >= 0 && origin < len(p.Placement) {
		k := p.SubPool(origin).Keys()
		client := c.client(p, origin)
		if v, err := client.HGet(ctx, k.Transfers, token).Result(); err == nil {
			if t, err := lua.ParseTransfer(v, false); err == nil {
				side.transfer = &t
			}
		} else if !errors.Is(err, redis.Nil) {
			return side, rain.Errorf(rain.ErrUnavailable, err, "spill %s at %s sub-pool %d", token, id, origin)
		}
		if side.transfer == nil {
			if v, err := client.HGet(ctx, k.Resolved, token).Result(); err == nil {
				if t, err := lua.ParseTransfer(v, true); err == nil {
					side.transfer = &t
				}
			} else if !errors.Is(err, redis.Nil) {
				return side, rain.Errorf(rain.ErrUnavailable, err, "spill %s at %s sub-pool %d", token, id, origin)
			}
		}
	}
	if home >= 0 && home < len(p.Placement) {
		k := p.SubPool(home).Keys()
		if v, err := c.client(p, home).HGet(ctx, k.Verdicts, token).Result(); err == nil {
			if vd, err := lua.ParseVerdict(v); err == nil {
				side.verdict = &vd
			}
		} else if !errors.Is(err, redis.Nil) {
			return side, rain.Errorf(rain.ErrUnavailable, err, "spill %s at %s sub-pool %d", token, id, home)
		}
	}
	return side, nil
}
