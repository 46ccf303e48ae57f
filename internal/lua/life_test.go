package lua

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
)

// TestConfirmManyAsOneByOne: a batch of confirms leaves a sub-pool exactly
// as the same confirms one by one do, and answers each grant as Confirm
// does (a repeat in the batch, a released grant, another serial, no grant).
func TestConfirmManyAsOneByOne(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	a := openSubPool(t, c, 0, 60_000, 5, 6, 7)
	b := openSubPool(t, c, 1, 60_000, 5, 6, 7)
	for _, k := range []*rain.Keys{&a, &b} {
		for i, u := range []string{"u1", "u2", "u3"} {
			if cl, err := claimOne(ctx, c, k, u, int64(100+i), "", 0); err != nil || cl.Outcome != Granted {
				t.Fatalf("claim %s = %+v, %v", u, cl, err)
			}
		}
	}
	amount := func(k *rain.Keys, user string) int64 {
		t.Helper()
		g, err := c.HGet(ctx, k.Grants, user).Result()
		if err != nil {
			t.Fatal(err)
		}
		_, a, _, _ := grantFields(g)
		return a
	}
	a1, a2 := amount(&a, "u1"), amount(&a, "u2")
	if b1, b2 := amount(&b, "u1"), amount(&b, "u2"); a1 != b1 || a2 != b2 {
		t.Fatalf("the two sub-pools granted u1 %d and %d, u2 %d and %d; want the same", a1, b1, a2, b2)
	}
	batch := []ConfirmArg{{"u1", 100, a1}, {"u2", 101, a2}, {"u1", 100, a1}, {"u3", 999, 5}, {"nobody", 5, 5}}
	got, errs, err := ConfirmMany(ctx, c, &a, batch)
	if err != nil {
		t.Fatal(err)
	}
	want := []Confirmation{Confirmed, Confirmed, AlreadyConfirmed, SerialMismatch, UnknownGrant}
	for i, g := range batch {
		one, err := Confirm(ctx, c, &b, g.User, g.Serial)
		if err != nil || errs[i] != nil {
			t.Fatalf("confirm %v: one by one %v, in a batch %v", g, err, errs[i])
		}
		if got[i].Result != want[i] || one != want[i] {
			t.Errorf("confirm %v: batch %v, one by one %v; want %v", g, got[i].Result, one, want[i])
		}
		if (want[i] == Confirmed || want[i] == AlreadyConfirmed) && got[i].Amount <= 0 {
			t.Errorf("confirm %v: amount %d, want the grant's", g, got[i].Amount)
		}
	}
	sa, sb := state(t, c, a.Meta, a.Grants, a.Deadlines), state(t, c, b.Meta, b.Grants, b.Deadlines)
	if !reflect.DeepEqual(rename(sa, a, b), rename(sb, b, b)) {
		t.Fatalf("a batch of confirms left\n%v\none by one\n%v", sa, sb)
	}
}

// rename is st with a's key names turned into b's, without what differs
// between two sub-pools by design: the meta's index and version, and the deadlines
// (the grants were made a few ms apart).
func rename(st map[string]any, a, b rain.Keys) map[string]any {
	names := map[string]string{a.Meta: b.Meta, a.Grants: b.Grants, a.Deadlines: b.Deadlines}
	out := map[string]any{}
	for k, v := range st {
		switch x := v.(type) {
		case map[string]string:
			m := map[string]string{}
			for f, val := range x {
				if k == a.Grants {
					val = val[:strings.LastIndexByte(val, ':')]
				}
				m[f] = val
			}
			if k == a.Meta {
				m["index"] = "1"
				delete(m, "version") // moved once per script: once for a batch
			}
			v = m
		case []redis.Z:
			var members []any
			for _, z := range x {
				members = append(members, z.Member)
			}
			v = members
		}
		out[names[k]] = v
	}
	return out
}

// TestSealOnlyWhatCannotMove: a sub-pool seals only once its window has
// ended, nothing is held, no spill is in flight out of it and its outbox is
// empty, each refusal naming its reason and changing nothing; sealed, it
// answers claims ended, gives no stock to a spill and adopts none; sealed
// again it answers the same account; unsealed it is open again.
func TestSealOnlyWhatCannotMove(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	h := openSubPool(t, c, 0, 60_000, 5, 6, 7)
	j := openSubPool(t, c, 1, 60_000, 20)
	seal := func(k *rain.Keys) Sealed {
		t.Helper()
		s, err := Seal(ctx, c, k, "close-1", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	refused := func(k *rain.Keys, reason string, n int64) {
		t.Helper()
		before := state(t, c, k.All()...)
		if s := seal(k); s.OK || s.Reason != reason || s.N != n {
			t.Fatalf("seal = %+v, want refused for %s (%d)", s, reason, n)
		}
		if after := state(t, c, k.All()...); !reflect.DeepEqual(before, after) {
			t.Fatalf("a refused seal changed the sub-pool:\nbefore %v\nafter  %v", before, after)
		}
	}
	refused(&h, "window", 0)
	g, err := claimOne(ctx, c, &h, "u1", 1, "", 0)
	if err != nil || g.Outcome != Granted {
		t.Fatalf("claim = %+v, %v", g, err)
	}
	if tk, _, err := Take(ctx, c, &j, "t1", 0, "u9", 0); err != nil || tk != TakenAmount {
		t.Fatalf("take = %v, %v", tk, err)
	}
	for _, k := range []*rain.Keys{&h, &j} {
		if _, err := End(ctx, c, k); err != nil {
			t.Fatal(err)
		}
	}
	refused(&h, "held", 1)
	refused(&j, "inflight", 1)
	if r, err := Confirm(ctx, c, &h, "u1", 1); err != nil || r != Confirmed {
		t.Fatalf("confirm = %v, %v", r, err)
	}
	refused(&h, "unsettled", 1) // the grant's outbox entry, not yet acknowledged
	if err := c.XTrimMaxLen(ctx, h.Outbox, 0).Err(); err != nil {
		t.Fatal(err)
	}
	s := seal(&h)
	if !s.OK || s.Count != 3 || s.Cents != 18 || s.ConfirmedCount != 1 || s.ConfirmedCents != g.Amount ||
		s.StockCount != 2 || s.StockCents != 18-g.Amount {
		t.Fatalf("seal = %+v; want sealed now, 3 packets (18 cents), 1 confirmed (%d cents), the rest in stock", s, g.Amount)
	}
	if again := seal(&h); again != s {
		t.Fatalf("sealed again by its owner = %+v; want the same account %+v", again, s)
	}
	if cl, err := claimOne(ctx, c, &h, "u2", 2, "", 0); err != nil || cl.Outcome != Ended {
		t.Fatalf("a claim on a sealed sub-pool = %+v, %v; want ended", cl, err)
	}
	if tk, _, err := Take(ctx, c, &h, "t2", 1, "u8", 0); err != nil || tk != TakeEnded {
		t.Fatalf("a take from a sealed sub-pool = %v, %v; want ended", tk, err)
	}
	if err := c.HSet(ctx, h.Reserve, "u9", "t1:1").Err(); err != nil { // a reservation made before the seal
		t.Fatal(err)
	}
	if _, ok, err := Adopt(ctx, c, &h, "u9", "t1", 9, 20, 1, 1<<40, 0); err != nil || ok {
		t.Fatalf("adopt into a sealed home = %v, %v; want refused (the sibling puts the amount back)", ok, err)
	}
	if ok, err := Unseal(ctx, c, &h, "close-1"); err != nil || !ok {
		t.Fatalf("unseal by the owner = %v, %v", ok, err)
	}
	if st, _ := c.HGet(ctx, h.Meta, "state").Result(); st != "open" {
		t.Fatalf("state after unseal = %q, want open", st)
	}
}

// TestEndKeepsAnEarlierEnd: End ends an open window now, and keeps an end
// that came first.
func TestEndKeepsAnEarlierEnd(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 60_000, 5)
	first, err := End(ctx, c, &k)
	if err != nil || first <= 0 {
		t.Fatalf("end = %d, %v", first, err)
	}
	if cl, err := claimOne(ctx, c, &k, "u", 1, "", 0); err != nil || cl.Outcome != Ended {
		t.Fatalf("claim after end = %+v, %v; want ended", cl, err)
	}
	if again, err := End(ctx, c, &k); err != nil || again != first {
		t.Fatalf("end again = %d, %v; want the first end %d", again, err, first)
	}
	if none, err := End(ctx, c, &rain.Keys{Meta: "rain:{nothing:0}:meta"}); err != nil || none != -1 {
		t.Fatalf("end of no sub-pool = %d, %v; want -1", none, err)
	}
}
