package lua

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
)

// state is everything a sub-pool holds, in a form two reads can compare
// (streams by entry contents, without their ids).
func state(t *testing.T, c *redis.Client, keys ...string) map[string]any {
	t.Helper()
	ctx := context.Background()
	out := map[string]any{}
	for _, k := range keys {
		typ, err := c.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		switch typ {
		case "none":
			continue
		case "string":
			v, err = c.Get(ctx, k).Result()
		case "hash":
			v, err = c.HGetAll(ctx, k).Result()
		case "list":
			v, err = c.LRange(ctx, k, 0, -1).Result()
		case "zset":
			v, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "stream":
			var msgs []redis.XMessage
			msgs, err = c.XRange(ctx, k, "-", "+").Result()
			vals := make([]string, len(msgs))
			for i, m := range msgs {
				vals[i] = fmt.Sprint(m.Values)
			}
			v = vals
		default:
			t.Fatalf("key %s has unexpected type %s", k, typ)
		}
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// openSubPool sets up sub-pool j of pool "r" with the amounts, open.
func openSubPool(t *testing.T, c *redis.Client, j int, hold int64, amounts ...int64) rain.Keys {
	t.Helper()
	ctx := context.Background()
	sp := rain.SubPool{Pool: "r", Index: j}
	var sum int64
	for _, a := range amounts {
		sum += a
	}
	if _, _, err := Setup(ctx, c, sp, int64(len(amounts)), sum, Window{HoldMS: hold}); err != nil {
		t.Fatal(err)
	}
	if err := LoadScripts(ctx, c); err != nil {
		t.Fatal(err)
	}
	if len(amounts) > 0 {
		load(t, c, sp, 0, amounts...)
	}
	if ok, _, _, err := OpenSubPool(ctx, c, sp); err != nil || !ok {
		t.Fatalf("open %s: %v %v", sp.Tag(), ok, err)
	}
	return sp.Keys()
}

// TestEveryStepTwice: every script run a second time with the same
// arguments, as go-redis sends it again after a lost reply, answers as the
// first run did and changes nothing. (Through a real loss-injecting proxy:
// see resend_proxy_test.go.) Where the second answer differs by design it
// says so: confirm and confirm_many answer "already" (the same effect), a
// group answers "exists" where it created, release and the
// serial reservation do the work of a new call (nothing twice, a gap).
func TestEveryStepTwice(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	h := openSubPool(t, c, 0, 60_000, 10)     // home: one packet
	j := openSubPool(t, c, 1, 60_000, 20, 30) // sibling: two
	m := openSubPool(t, c, 3, 60_000, 5, 6)   // for claim_many
	e := openSubPool(t, c, 4, 60_000, 9)      // ended and sealed
	all := slices.Concat(h.All(), j.All(), m.All(), e.All())
	const valid = 60_000
	var acked string // the outbox entry acknowledged

	steps := []struct {
		name string
		run  func() (any, error)
		same bool // the second answer equals the first
	}{
		{"claim granted", func() (any, error) { return claimOne(ctx, c, &h, "u1", 101, "101", valid) }, true},
		{"claim_many", func() (any, error) {
			cl, errs, err := ClaimMany(ctx, c, &m, valid, []ClaimArg{{"m1", 201, "201"}, {"m2", 202, "202"}, {"m1", 203, "203"}})
			return fmt.Sprint(cl, errs), err
		}, true},
		{"claim reserved", func() (any, error) { return claimOne(ctx, c, &h, "u2", 102, "102", valid) }, true},
		{"take", func() (any, error) {
			r, a, err := Take(ctx, c, &j, "102", 0, "u2", 0)
			return fmt.Sprint(r, a), err
		}, true},
		{"adopt", func() (any, error) {
			cl, ok, err := Adopt(ctx, c, &h, "u2", "102", 102, 20, 1, valid, 0)
			return fmt.Sprint(cl, ok), err
		}, true},
		{"ack", func() (any, error) { return Ack(ctx, c, &j, "102") }, true},
		{"claim reserved again", func() (any, error) { return claimOne(ctx, c, &h, "u3", 103, "103", valid) }, true},
		{"take again", func() (any, error) {
			r, a, err := Take(ctx, c, &j, "103", 0, "u3", 0)
			return fmt.Sprint(r, a), err
		}, true},
		{"decide refuses", func() (any, error) { return Decide(ctx, c, &h, "103", "u3", 0) }, true},
		{"adopt refused", func() (any, error) {
			cl, ok, err := Adopt(ctx, c, &h, "u3", "103", 103, 30, 1, valid, 0)
			return fmt.Sprint(cl, ok), err
		}, true},
		{"untake", func() (any, error) { return Untake(ctx, c, &j, "103") }, true},
		{"decide adopted", func() (any, error) { return Decide(ctx, c, &h, "102", "u2", 0) }, true},
		{"claim reserved, then abort", func() (any, error) { return claimOne(ctx, c, &h, "u4", 104, "104", valid) }, true},
		{"abort", func() (any, error) { return Abort(ctx, c, &h, "u4", "104", true) }, true},
		{"confirm", func() (any, error) { return Confirm(ctx, c, &h, "u1", 101) }, false},
		// confirm_many sent again answers "already" where it confirmed.
		{"confirm_many", func() (any, error) {
			r, errs, err := ConfirmMany(ctx, c, &h, []ConfirmArg{{"u2", 102, 20}, {"u1", 101, 10}})
			return fmt.Sprint(r, errs), err
		}, false},
		{"end", func() (any, error) { return End(ctx, c, &e) }, true},
		// seal sent again, by its owner, answers the same account.
		{"seal", func() (any, error) { return Seal(ctx, c, &e, "owner", time.Minute) }, true},
		{"unseal of another owner's seal", func() (any, error) { return Unseal(ctx, c, &e, "other") }, true},
		{"retire", func() (any, error) {
			ok, st, err := Retire(ctx, c, rain.SubPool{Pool: "r", Index: 4})
			return fmt.Sprint(ok, st), err
		}, true},
		{"group", func() (any, error) { return EnsureGroup(ctx, c, &m, "settle") }, false}, // created, then exists
		{"acknowledge", func() (any, error) {
			if acked == "" { // the same entry both times
				ids, err := c.XRange(ctx, m.Outbox, "-", "+").Result()
				if err != nil || len(ids) == 0 {
					return nil, fmt.Errorf("outbox of m: %v, %v", ids, err)
				}
				acked = ids[0].ID
			}
			return nil, Acknowledge(ctx, c, m.Outbox, "settle", []string{acked})
		}, true},
		{"record", func() (any, error) {
			// The record the same; whether this call moved it differs (the
			// first did), as PutRecord says.
			m, _, err := PutRecord(ctx, c, "rain:{r}:pool", map[string]string{"spec": "s", "seed": "1", "placement": "a", "state": "open"})
			return m, err
		}, true},
		{"watermark", func() (any, error) { return RaiseWatermark(ctx, c, "rain:serial:watermark", 500) }, true},
		{"setup", func() (any, error) {
			st, next, err := Setup(ctx, c, rain.SubPool{Pool: "r", Index: 0}, 1, 10, Window{HoldMS: 60_000})
			return fmt.Sprint(st, next), err
		}, true},
		{"open", func() (any, error) {
			ok, n, cents, err := OpenSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 0})
			return fmt.Sprint(ok, n, cents), err
		}, true},
	}
	for _, step := range steps {
		first, err := step.run()
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		before := state(t, c, append(all, "rain:{r}:pool", "rain:serial:watermark")...)
		second, err := step.run()
		if err != nil {
			t.Fatalf("%s, sent again: %v", step.name, err)
		}
		if step.same && !reflect.DeepEqual(first, second) {
			t.Errorf("%s answered %v, and %v when sent again; want the same answer", step.name, first, second)
		}
		if after := state(t, c, append(all, "rain:{r}:pool", "rain:serial:watermark")...); !reflect.DeepEqual(before, after) {
			t.Errorf("%s sent again changed the shard:\nbefore %v\nafter  %v", step.name, before, after)
		}
	}
	// The serial reservation sent again reserves a new segment: a gap.
	e1, err := ReserveSerials(ctx, c, "rain:serial", 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	if e2, err := ReserveSerials(ctx, c, "rain:serial", 100, 0); err != nil || e2 != e1+100 {
		t.Fatalf("serial sent again = %d, %v; want %d: a new segment after the first, never the same", e2, err, e1+100)
	}
	// The load of a batch sent again is skipped and appends nothing.
	sp := rain.SubPool{Pool: "r", Index: 2}
	if _, _, err := Setup(ctx, c, sp, 2, 3, Window{HoldMS: 1}); err != nil {
		t.Fatal(err)
	}
	if res, next := load(t, c, sp, 0, 1, 2); res != Loaded || next != 1 {
		t.Fatalf("load = %s %d, want loaded, next 1", res, next)
	}
	before := state(t, c, sp.Keys().All()...)
	if res, next := load(t, c, sp, 0, 1, 2); res != Skipped || next != 1 {
		t.Fatalf("load sent again = %s %d, want skipped, next 1", res, next)
	}
	if after := state(t, c, sp.Keys().All()...); !reflect.DeepEqual(before, after) {
		t.Fatalf("load sent again changed the sub-pool:\nbefore %v\nafter  %v", before, after)
	}
}

// TestTakeRefusesAReusedToken: a token stored for one user or home takes
// nothing for another (a serial handed out twice must not hand one popped
// amount to two users).
func TestTakeRefusesAReusedToken(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	j := openSubPool(t, c, 1, 60_000, 20, 30)
	if r, a, err := Take(ctx, c, &j, "7", 0, "alice", 0); err != nil || r != TakenAmount || a != 20 {
		t.Fatalf("take = %v %d, %v; want 20 taken", r, a, err)
	}
	for _, tc := range []struct {
		home int
		user string
	}{{0, "bob"}, {2, "alice"}} {
		if r, a, err := Take(ctx, c, &j, "7", tc.home, tc.user, 0); err != nil || r != TakeConflict || a != 0 {
			t.Fatalf("take of token 7 for home %d user %s = %v %d, %v; want a conflict, nothing taken", tc.home, tc.user, r, a, err)
		}
	}
	if n, err := c.LLen(ctx, j.Stock).Result(); err != nil || n != 1 {
		t.Fatalf("stock after the refused takes = %d, %v; want 1 (only alice's take popped)", n, err)
	}
	if _, err := Ack(ctx, c, &j, "7"); err != nil {
		t.Fatal(err)
	}
	if r, _, err := Take(ctx, c, &j, "7", 0, "alice", 0); err != nil || r != TakeResolved {
		t.Fatalf("take of a resolved token = %v, %v; want resolved, nothing taken", r, err)
	}
	if r, err := Untake(ctx, c, &j, "7"); err != nil || r != ResolveConflict {
		t.Fatalf("untake of an acked transfer = %v, %v; want a conflict, nothing returned", r, err)
	}
}
