package lua

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// endAndSeal ends sub-pool k's window now and seals it for owner: it has
// nothing held, nothing in flight and nothing unsettled.
func endAndSeal(t *testing.T, c Client, k *rain.Keys, owner string) Sealed {
	t.Helper()
	ctx := context.Background()
	if _, err := End(ctx, c, k); err != nil {
		t.Fatal(err)
	}
	s, err := Seal(ctx, c, k, owner, time.Minute)
	if err != nil || !s.OK {
		t.Fatalf("seal = %+v, %v", s, err)
	}
	return s
}

// TestNothingWritesToAClosedSubPool: once a sub-pool is retired (its pool
// closed), its keys are gone but a tombstone, and no script writes a key of
// it again: a preload that stalled past the close (setup, load, open), the
// late steps of a spill (take, adopt, decide, abort, ack, untake), a claim,
// a confirm, the reaper's release and recovery, settlement's consumer group
// and acknowledgment, an end, a seal. Each answers as for a closed
// sub-pool.
func TestNothingWritesToAClosedSubPool(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	h := openSubPool(t, c, 0, 60_000, 10, 11)
	sp := rain.SubPool{Pool: "r", Index: 0}
	endAndSeal(t, c, &h, "close-1")
	if ok, st, err := Retire(ctx, c, sp); err != nil || !ok {
		t.Fatalf("retire = %v %q, %v", ok, st, err)
	}
	tomb := map[string]any{h.Meta: map[string]string{"state": "closed", "pool": "r", "index": "0"}}
	if got := state(t, c, h.All()...); !reflect.DeepEqual(got, tomb) {
		t.Fatalf("a retired sub-pool holds %v; want its tombstone alone %v", got, tomb)
	}
	steps := []struct {
		name string
		run  func() (any, error)
		want string // the answer, as fmt.Sprint prints it
	}{
		{"setup", func() (any, error) {
			_, _, err := Setup(ctx, c, sp, 2, 21, Window{HoldMS: 60_000})
			return fmt.Sprint(err != nil && strings.Contains(err.Error(), ErrClosed.Error())), nil
		}, "true"},
		{"load", func() (any, error) {
			res, _ := load(t, c, sp, 0, 10, 11)
			return res, nil
		}, "closed"},
		{"open", func() (any, error) {
			_, _, _, err := OpenSubPool(ctx, c, sp)
			return fmt.Sprint(err != nil && strings.Contains(err.Error(), ErrClosed.Error())), nil
		}, "true"},
		{"claim", func() (any, error) {
			cl, err := claimOne(ctx, c, &h, "u1", 1, "1", 60_000)
			return cl.Outcome, err
		}, fmt.Sprint(Closed)},
		{"take", func() (any, error) {
			r, _, err := Take(ctx, c, &h, "2", 1, "u2", 0)
			return r, err
		}, fmt.Sprint(TakeEnded)},
		{"adopt", func() (any, error) {
			_, ok, err := Adopt(ctx, c, &h, "u2", "2", 2, 10, 1, 60_000, 0)
			return ok, err
		}, "false"},
		{"decide", func() (any, error) { return Decide(ctx, c, &h, "3", "u3", 0) }, fmt.Sprint(Verdict{})},
		{"abort", func() (any, error) { return Abort(ctx, c, &h, "u4", "4", true) }, "false"},
		{"ack", func() (any, error) { return Ack(ctx, c, &h, "5") }, fmt.Sprint(NoTransfer)},
		{"untake", func() (any, error) { return Untake(ctx, c, &h, "5") }, fmt.Sprint(NoTransfer)},
		{"confirm", func() (any, error) { return Confirm(ctx, c, &h, "u1", 1) }, fmt.Sprint(UnknownGrant)},
		{"confirm_many", func() (any, error) {
			r, _, err := ConfirmMany(ctx, c, &h, []ConfirmArg{{"u1", 1, 10}})
			return r[0].Result, err
		}, fmt.Sprint(UnknownGrant)},
		{"release", func() (any, error) {
			r, err := ReleaseExpired(ctx, c, &h, 10)
			return r.Count, err
		}, "0"},
		{"transfers", func() (any, error) {
			f, err := StaleTransfers(ctx, c, &h, 1, 0)
			return len(f.Stale), err
		}, "0"},
		{"group", func() (any, error) { return EnsureGroup(ctx, c, &h, "settle") }, fmt.Sprint(GroupGone)},
		{"acknowledge", func() (any, error) { return nil, Acknowledge(ctx, c, h.Outbox, "settle", []string{"1-1"}) }, "<nil>"},
		{"end", func() (any, error) { return End(ctx, c, &h) }, "-1"},
		{"seal", func() (any, error) {
			s, err := Seal(ctx, c, &h, "close-2", time.Minute)
			return s.Reason, err
		}, "closed"},
		{"retire again", func() (any, error) {
			ok, _, err := Retire(ctx, c, sp)
			return ok, err
		}, "true"},
	}
	for _, step := range steps {
		got, err := step.run()
		if err != nil {
			t.Fatalf("%s on a closed sub-pool: %v", step.name, err)
		}
		if fmt.Sprint(got) != step.want {
			t.Errorf("%s on a closed sub-pool answered %v, want %s", step.name, got, step.want)
		}
		if after := state(t, c, h.All()...); !reflect.DeepEqual(after, tomb) {
			t.Fatalf("%s wrote to a closed sub-pool: it holds %v", step.name, after)
		}
	}
}

// TestRetireOnlyWhatCannotMove: retire frees a sealed sub-pool, and one
// whose seal a concurrent close put back while nothing can move in it; an
// open one, or one with grants held, is refused and left as it was.
func TestRetireOnlyWhatCannotMove(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	openSubPool(t, c, 0, 60_000, 10)
	if ok, st, err := Retire(ctx, c, rain.SubPool{Pool: "r", Index: 0}); err != nil || ok || st != "open" {
		t.Fatalf("retire of an open sub-pool = %v %q, %v; want refused", ok, st, err)
	}
	held := openSubPool(t, c, 1, 60_000, 10)
	if cl, err := claimOne(ctx, c, &held, "u", 1, "", 0); err != nil || cl.Outcome != Granted {
		t.Fatalf("claim = %+v, %v", cl, err)
	}
	if _, err := End(ctx, c, &held); err != nil {
		t.Fatal(err)
	}
	before := state(t, c, held.All()...)
	if ok, _, err := Retire(ctx, c, rain.SubPool{Pool: "r", Index: 1}); err != nil || ok {
		t.Fatalf("retire with a grant held = %v, %v; want refused", ok, err)
	}
	if after := state(t, c, held.All()...); !reflect.DeepEqual(before, after) {
		t.Fatalf("a refused retire changed the sub-pool:\nbefore %v\nafter  %v", before, after)
	}
	quiet := openSubPool(t, c, 2, 60_000, 10)
	endAndSeal(t, c, &quiet, "close-1")
	if ok, err := Unseal(ctx, c, &quiet, "close-1"); err != nil || !ok {
		t.Fatalf("unseal = %v, %v", ok, err)
	}
	if ok, st, err := Retire(ctx, c, rain.SubPool{Pool: "r", Index: 2}); err != nil || !ok {
		t.Fatalf("retire of an ended, quiet, unsealed sub-pool = %v %q, %v; want retired", ok, st, err)
	}
}

// TestSealHasAnOwner: a seal belongs to the close that made it. Its owner
// seals again with the same answer (a re-sent seal, or its close run
// again); another close is told "sealing" with the time left of the lease
// and cannot unseal it; once the lease has run out (a close that died after
// sealing) the next close takes the seal over, and the first owner can no
// longer unseal it.
func TestSealHasAnOwner(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 60_000, 10)
	const lease = 300 * time.Millisecond
	if _, err := End(ctx, c, &k); err != nil {
		t.Fatal(err)
	}
	first, err := Seal(ctx, c, &k, "a", lease)
	if err != nil || !first.OK {
		t.Fatalf("seal by a = %+v, %v", first, err)
	}
	if again, err := Seal(ctx, c, &k, "a", lease); err != nil || again != first {
		t.Fatalf("seal by a again = %+v, %v; want %+v", again, err, first)
	}
	other, err := Seal(ctx, c, &k, "b", lease)
	if err != nil || other.OK || other.Reason != "sealing" || other.N <= 0 || other.N > lease.Milliseconds() {
		t.Fatalf("seal by b within a's lease = %+v, %v; want refused, sealing, with up to %v left", other, err, lease)
	}
	if ok, err := Unseal(ctx, c, &k, "b"); err != nil || ok {
		t.Fatalf("unseal by b = %v, %v; want a's seal kept", ok, err)
	}
	var taken Sealed
	waittest.Until(t, 5*time.Second, "b takes the seal over once a's lease has run out", func() bool {
		taken, err = Seal(ctx, c, &k, "b", lease)
		return err == nil && taken.OK
	})
	if taken != first {
		t.Fatalf("seal taken over by b = %+v; want the same account %+v", taken, first)
	}
	if ok, err := Unseal(ctx, c, &k, "a"); err != nil || ok {
		t.Fatalf("unseal by a after b took the seal over = %v, %v; want b's seal kept", ok, err)
	}
	if st, _ := c.HGet(ctx, k.Meta, "state").Result(); st != "closing" {
		t.Fatalf("state = %q, want closing (sealed by b)", st)
	}
	if ok, err := Unseal(ctx, c, &k, "b"); err != nil || !ok {
		t.Fatalf("unseal by b = %v, %v", ok, err)
	}
}

// TestSpillRefusedOnceEnded: once a sub-pool's window has ended nothing
// moves into or out of it by a spill: a take answers ended and takes
// nothing, an adopt refuses (answering ended, and the same when sent
// again), so a sealed or closing pool cannot gain a grant late.
func TestSpillRefusedOnceEnded(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	h := openSubPool(t, c, 0, 60_000)     // empty home
	j := openSubPool(t, c, 1, 60_000, 20) // sibling with one packet
	if cl, err := claimOne(ctx, c, &h, "u", 1, "1", 60_000); err != nil || cl.Outcome != Reserved {
		t.Fatalf("claim at the empty home = %+v, %v; want reserved", cl, err)
	}
	taken, amount, err := Take(ctx, c, &j, "1", 0, "u", 0)
	if err != nil || taken != TakenAmount {
		t.Fatalf("take = %v, %v", taken, err)
	}
	for _, k := range []*rain.Keys{&h, &j} {
		if _, err := End(ctx, c, k); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // the adopt, then the same adopt sent again
		cl, ok, err := Adopt(ctx, c, &h, "u", "1", 1, amount, 1, 60_000, 0)
		if err != nil || ok || cl.Outcome != Ended {
			t.Fatalf("adopt after the end = %+v, %v, %v; want refused, ended", cl, ok, err)
		}
	}
	if g, _ := c.HGet(ctx, h.Grants, "u").Result(); g != "" {
		t.Fatalf("the user holds %q after a refused adopt", g)
	}
	if r, err := Untake(ctx, c, &j, "1"); err != nil || r != Returned {
		t.Fatalf("untake = %v, %v", r, err)
	}
	before := state(t, c, j.All()...)
	if r, _, err := Take(ctx, c, &j, "2", 0, "v", 0); err != nil || r != TakeEnded {
		t.Fatalf("take after the end = %v, %v; want ended", r, err)
	}
	if after := state(t, c, j.All()...); !reflect.DeepEqual(before, after) {
		t.Fatalf("a take after the end changed the sibling:\nbefore %v\nafter  %v", before, after)
	}
}

// TestClaimManyReleasesBeforeItPops: a batch whose later claim finds its
// user's hold run out offers that amount to the whole batch: a claim
// before it in the batch is granted the released packet instead of hearing
// "empty" beside it (invariant 4).
func TestClaimManyReleasesBeforeItPops(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 20, 7) // one packet, a hold of 20 ms
	first, err := claimOne(ctx, c, &k, "old", 1, "", 0)
	if err != nil || first.Outcome != Granted {
		t.Fatalf("claim = %+v, %v", first, err)
	}
	waittest.Until(t, 5*time.Second, "the grant's deadline passed on the shard's clock", func() bool {
		tm, err := c.Time(ctx).Result()
		return err == nil && tm.UnixMilli() > first.DeadlineMS
	})
	claims, errs, err := ClaimMany(ctx, c, &k, 0, []ClaimArg{{User: "new", Serial: 2}, {User: "old", Serial: 3}})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("claim_many = %v, %v", errs, err)
	}
	if claims[0].Outcome != Granted || claims[0].Amount != 7 || claims[1].Outcome != Empty {
		t.Fatalf("claim_many = %+v; want the first claim granted the 7 cents released for the second, the second empty", claims)
	}
	a, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 0})
	if err != nil || a.StockCount != 0 || a.ListLen != 0 || a.HeldCount != 1 || a.ReleasedCount != 1 {
		t.Fatalf("audit %+v, %v: want nothing in stock, one held, one released", a, err)
	}
}

// TestAClaimSentAgainAfterItsReleaseIsRefused: a claim whose reply was
// lost and which comes again only after its grant was released at its
// deadline is refused unwritten: granting again under its serial would
// give two grants one serial (the first one's outbox entry would then wait
// for an operator). A new claim of the user is granted.
func TestAClaimSentAgainAfterItsReleaseIsRefused(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 20, 7, 8) // a hold of 20 ms
	first, err := claimOne(ctx, c, &k, "u", 1, "", 0)
	if err != nil || first.Outcome != Granted {
		t.Fatalf("claim = %+v, %v", first, err)
	}
	waittest.Until(t, 5*time.Second, "the grant released at its deadline", func() bool {
		r, err := ReleaseExpired(ctx, c, &k, 10)
		if err != nil {
			t.Fatal(err)
		}
		return r.Count == 1
	})
	claims, errs, err := ClaimMany(ctx, c, &k, 0, []ClaimArg{{User: "u", Serial: 1}})
	if err != nil || errs[0] == nil || !strings.Contains(errs[0].Error(), "released before its claim came again") {
		t.Fatalf("the claim sent again = %+v, %v, %v; want refused", claims, errs, err)
	}
	a, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 0})
	if err != nil || a.StockCount != 2 || a.HeldCount != 0 || a.ReleasedCount != 1 || a.DuplicateSerials != 0 {
		t.Fatalf("audit %+v, %v: want both packets in stock, nothing held, one released", a, err)
	}
	again, err := claimOne(ctx, c, &k, "u", 2, "", 0)
	if err != nil || again.Outcome != Granted || again.Serial != 2 {
		t.Fatalf("a new claim = %+v, %v; want granted under its serial", again, err)
	}
}

// TestABatchSentAgainWithTwoClaimsOfAUser: two grabs of one user in one
// batch, the batch sent again after the hold ran out and before the reaper
// came. The claim that made the grant is answered it again, as in the first
// run, and so is the other ("already"): the other claim never releases it
// for a new grant while the first is answered a grant this run released.
// Either order of the serials in the batch (sub-pools 0 and 1).
func TestABatchSentAgainWithTwoClaimsOfAUser(t *testing.T) {
	for _, made := range []int{0, 1} {
		ctx := context.Background()
		c := newClient(t)
		k := openSubPool(t, c, made, 20, 7, 8) // a hold of 20 ms
		batch := []ClaimArg{{User: "u", Serial: 1}, {User: "u", Serial: 2}}
		if made == 1 {
			batch[0], batch[1] = batch[1], batch[0]
		}
		first, errs, err := ClaimMany(ctx, c, &k, 0, batch)
		if err != nil || errs[0] != nil || errs[1] != nil || first[0].Outcome != Granted || first[1].Outcome != Already {
			t.Fatalf("batch = %+v, %v, %v; want the first claim granted, the second already", first, errs, err)
		}
		waittest.Until(t, 5*time.Second, "the grant's deadline passed on the shard's clock", func() bool {
			tm, err := c.Time(ctx).Result()
			return err == nil && tm.UnixMilli() > first[0].DeadlineMS
		})
		again, errs, err := ClaimMany(ctx, c, &k, 0, batch)
		if err != nil || errs[0] != nil || errs[1] != nil || again[0] != first[0] || again[1] != first[1] {
			t.Fatalf("batch sent again = %+v, %v, %v; want the first run's answers %+v", again, errs, err, first)
		}
		a, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: made})
		if err != nil || a.HeldCount != 1 || a.ReleasedCount != 0 || a.StockCount != 1 {
			t.Fatalf("audit %+v, %v: want the grant still held, nothing released, one packet in stock", a, err)
		}
	}
}

// TestConfirmManyRefusesAnotherAmount: settlement confirms a grant only for
// the amount it is about to pay; an outbox entry whose amount is not the
// grant's confirms nothing and says what the grant holds.
func TestConfirmManyRefusesAnotherAmount(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 60_000, 7)
	if cl, err := claimOne(ctx, c, &k, "u", 1, "", 0); err != nil || cl.Outcome != Granted {
		t.Fatalf("claim = %+v, %v", cl, err)
	}
	before := state(t, c, k.All()...)
	r, errs, err := ConfirmMany(ctx, c, &k, []ConfirmArg{{"u", 1, 700}})
	if err != nil || errs[0] != nil || r[0] != (ConfirmResult{AmountMismatch, 7}) {
		t.Fatalf("confirm of 700 cents for a grant of 7 = %+v, %v, %v; want refused, the grant's 7", r, errs, err)
	}
	if after := state(t, c, k.All()...); !reflect.DeepEqual(before, after) {
		t.Fatalf("a refused confirm changed the sub-pool:\nbefore %v\nafter  %v", before, after)
	}
	if r, _, err := ConfirmMany(ctx, c, &k, []ConfirmArg{{"u", 1, 7}}); err != nil || r[0].Result != Confirmed {
		t.Fatalf("confirm of the grant's amount = %+v, %v", r, err)
	}
}

// TestRecordOnlyMovesOn: a pool's record is written whole where there is
// none (or only a part of one), moves on along the pool's life with its
// account, and never goes back: a stalled preload's "open" leaves a closed
// record closed, and a record of another spec is left as it is.
func TestRecordOnlyMovesOn(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	const key = "rain:{p}:pool"
	rec := func(state, account string) map[string]string {
		return map[string]string{"spec": `{"pool_id":"p"}`, "seed": "7", "placement": "a,b", "state": state, "account": account}
	}
	put := func(f map[string]string, wantMoved bool) map[string]string {
		t.Helper()
		m, moved, err := PutRecord(ctx, c, key, f)
		if err != nil {
			t.Fatal(err)
		}
		if moved != wantMoved {
			t.Fatalf("PutRecord(%s) moved = %v, want %v", f["state"], moved, wantMoved)
		}
		return m
	}
	want := func(m map[string]string, state, account string) {
		t.Helper()
		w := rec(state, account)
		if account == "" {
			delete(w, "account")
		}
		if !reflect.DeepEqual(m, w) {
			t.Fatalf("record %v, want %v", m, w)
		}
	}
	if err := c.HSet(ctx, key, "state", "closing").Err(); err != nil { // a part, as a blind write left one
		t.Fatal(err)
	}
	want(put(rec("loading", ""), true), "loading", "") // written whole
	want(put(rec("loading", ""), false), "loading", "")
	want(put(rec("open", ""), true), "open", "")
	want(put(rec("open", ""), false), "open", "") // a second preload's open: it did not open it
	acct, _ := json.Marshal(map[string]any{"pool_id": "p", "state": "closing"})
	want(put(rec("closing", string(acct)), true), "closing", string(acct))
	want(put(rec("open", ""), false), "closing", string(acct)) // a stalled preload opens nothing
	closed, _ := json.Marshal(map[string]any{"pool_id": "p", "state": "closed"})
	want(put(rec("closed", string(closed)), true), "closed", string(closed))
	want(put(rec("closing", string(acct)), false), "closed", string(closed))
	other := rec("closed", "{}")
	other["seed"] = "8"
	want(put(other, false), "closed", string(closed))
}

// TestEndedIsAFact: once a sub-pool's end has been seen (an operator's
// end, a claim after its ends_ms, a seal), it is recorded, and a clock
// that goes back (a failover to a host whose clock is behind, a step of
// NTP; played here by moving ends_ms ahead of the clock, which is the same
// comparison) never opens the window again: claims answer ended, a spill
// takes and adopts nothing, a close can seal it.
func TestEndedIsAFact(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	h := openSubPool(t, c, 0, 60_000)     // empty home
	j := openSubPool(t, c, 1, 60_000, 20) // sibling with one packet
	seen := openSubPool(t, c, 2, 60_000, 7)
	if cl, err := claimOne(ctx, c, &h, "u", 1, "1", 60_000); err != nil || cl.Outcome != Reserved {
		t.Fatalf("claim at the empty home = %+v, %v; want reserved", cl, err)
	}
	if r, _, err := Take(ctx, c, &j, "1", 0, "u", 0); err != nil || r != TakenAmount {
		t.Fatalf("take = %v, %v", r, err)
	}
	for _, k := range []*rain.Keys{&h, &j} {
		if _, err := End(ctx, c, k); err != nil {
			t.Fatal(err)
		}
	}
	// seen's end is seen by a claim after its ends_ms, not by End.
	if err := c.HSet(ctx, seen.Meta, "ends_ms", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if cl, err := claimOne(ctx, c, &seen, "v", 2, "", 0); err != nil || cl.Outcome != Ended {
		t.Fatalf("claim after ends_ms = %+v, %v; want ended", cl, err)
	}
	back := time.Now().Add(time.Hour).UnixMilli() // the clock went an hour back
	for _, k := range []*rain.Keys{&h, &j, &seen} {
		if err := c.HSet(ctx, k.Meta, "ends_ms", back).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if cl, err := claimOne(ctx, c, &seen, "w", 3, "", 0); err != nil || cl.Outcome != Ended {
		t.Fatalf("claim once the clock went back = %+v, %v; want ended", cl, err)
	}
	if cl, ok, err := Adopt(ctx, c, &h, "u", "1", 1, 20, 1, 60_000, 0); err != nil || ok || cl.Outcome != Ended {
		t.Fatalf("adopt once the clock went back = %+v, %v, %v; want refused, ended", cl, ok, err)
	}
	if r, err := Untake(ctx, c, &j, "1"); err != nil || r != Returned {
		t.Fatalf("untake = %v, %v", r, err)
	}
	if r, _, err := Take(ctx, c, &j, "2", 0, "x", 0); err != nil || r != TakeEnded {
		t.Fatalf("take once the clock went back = %v, %v; want ended", r, err)
	}
	if s, err := Seal(ctx, c, &seen, "close", time.Minute); err != nil || !s.OK {
		t.Fatalf("seal once the clock went back = %+v, %v; want sealed", s, err)
	}
}

// TestWaitAfterAResendCoversTheGrant: a claim sent again on another
// connection of the pool (go-redis's retry after a lost reply), one whose
// last write a replica has, answers the grant its first run made; the
// WAIT after it must not say a replica has that grant when none has (the
// replica is frozen). WAIT counts the replicas that have the client's
// offset: Redis 7.0 moves it on every command, later versions only on a
// command that propagated, and a re-send writes nothing of its own; with
// the fence the re-send writes a counter, so the WAIT covers the grant on
// either.
func TestWaitAfterAResendCoversTheGrant(t *testing.T) {
	ctx := context.Background()
	primary := redistest.Start(t, redistest.Options{})
	replica := redistest.Start(t, redistest.Options{ReplicaOf: primary.Addr})
	cs := redistest.Clients(t, []*redistest.Server{primary, replica, primary})
	c, rc, other := cs[0], cs[1], cs[2]
	waittest.Until(t, 15*time.Second, "the replica in sync", func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	k := openSubPool(t, c.(*redis.Client), 0, 60_000, 5, 6)
	if err := other.Set(ctx, "early", 1, 0).Err(); err != nil { // the other connection's last write, before the grant
		t.Fatal(err)
	}
	if n, err := other.Do(ctx, "WAIT", 1, 5000).Int64(); err != nil || n != 1 { // the replica acknowledged it
		t.Fatalf("WAIT for the other connection's write = %d, %v", n, err)
	}
	replica.Pause()
	t.Cleanup(replica.Resume)
	if cl, err := claimOne(ctx, c, &k, "u", 1, "", 0); err != nil || cl.Outcome != Granted {
		t.Fatalf("claim = %+v, %v", cl, err)
	}
	resend := func(fence bool) (Claim, int64) {
		t.Helper()
		pipe := other.Pipeline()
		cmd := ClaimManyCmd(ctx, pipe, &k, 0, fence, Form{Outbox: OutboxBatch, BatchedDeadlines: true}, []ClaimArg{{User: "u", Serial: 1}}, nil)
		w := redis.NewIntCmd(ctx, "wait", 1, 300)
		_ = pipe.Process(ctx, w)
		_, _ = pipe.Exec(ctx)
		cl, errs, err := ParseClaimMany(cmd, 1)
		if err != nil || errs[0] != nil {
			t.Fatalf("claim sent again: %v %v", err, errs)
		}
		return cl[0], w.Val()
	}
	if cl, n := resend(true); cl.Outcome != Granted || n != 0 {
		t.Fatalf("with the fence: %+v, WAIT %d; want granted, and no replica with it (it is frozen)", cl, n)
	}
}
