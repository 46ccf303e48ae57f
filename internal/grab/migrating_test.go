package grab_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/grab"
	"rain/internal/lua"
	"rain/internal/redistest"
	"rain/internal/shard"
)

// TestScriptsRefusedOnAMigratingSlot: while a sub-pool's slot is being
// moved (MIGRATING on its node, IMPORTING on another), Redis refuses a
// script's command that touches a key not on the node, one the script
// itself emptied included, and keeps what the script wrote before it. A
// batch of two claims, a new user's and a repeat, pops the last two
// amounts of the stock (the list is gone) and must put one back: every
// script first reads a key that never exists, so on a migrating slot it
// answers TRYAGAIN before it writes anything; so does a confirm of two
// grants, the first of which empties the deadline index. The stock, the
// grants and the counters stay as they were; the grab path answers an outcome it
// does not know (never a grant); and once the slot is stable again the
// same batch grants, and the audit is ok.
func TestScriptsRefusedOnAMigratingSlot(t *testing.T) {
	ctx := context.Background()
	e, cl := clusterEnv(t, 0)
	e.preload(t, rain.Spec{PoolID: "mig", TotalCents: 500, Count: 5, SubPools: 1, HoldSeconds: 600})
	p, err := e.cat.Read(ctx, "mig")
	if err != nil {
		t.Fatal(err)
	}
	k := p.SubPool(0).Keys()
	owner, err := e.shards.Owner(ctx, "c1", k.Meta)
	if err != nil {
		t.Fatal(err)
	}
	node := e.shards.Node("c1", owner)
	form := lua.Form{Outbox: lua.OutboxBatch, BatchedDeadlines: true}
	claim := func(c *redis.Client, cs ...lua.ClaimArg) ([]lua.Claim, error) {
		pipe := c.Pipeline()
		cmd := lua.ClaimManyCmd(ctx, pipe, &k, 3000, false, form, cs, nil)
		_, _ = pipe.Exec(ctx)
		res, errs, err := lua.ParseClaimMany(cmd, len(cs))
		if err == nil {
			err = errors.Join(errs...)
		}
		return res, err
	}
	// Every key claim_many declares exists, or a migrating node refuses
	// the script before it runs: a batch's deadline member, a grant's
	// alone, a spill's reservation (another user's).
	two, err := claim(node, lua.ClaimArg{User: "u2", Serial: 2}, lua.ClaimArg{User: "u3", Serial: 3})
	if err != nil {
		t.Fatal(err)
	}
	one, err := claim(node, lua.ClaimArg{User: "u1", Serial: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.HSet(ctx, k.Reserve, "someone", "tok:1").Err(); err != nil {
		t.Fatal(err)
	}
	audit := func() {
		t.Helper()
		if rep, err := e.cat.Audit(ctx, "mig"); err != nil || !rep.OK {
			t.Fatalf("audit = %+v, %v", rep, err)
		}
	}
	audit()

	slot := shard.Slot(k.Meta)
	to := cl.OtherPrimary(cl.Owner(slot))
	from := cl.BeginMove(slot, to)
	src, dst := redistest.Client(t, from), redistest.Client(t, to)
	stable := func() {
		for _, c := range []*redis.Client{src, dst} {
			if err := c.Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE").Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(stable)

	// A new user and a repeat: two amounts popped (the stock's last), one
	// put back.
	batch := []lua.ClaimArg{{User: "u9", Serial: 9}, {User: "u1", Serial: 10}}
	res, err := claim(node, batch...)
	if !redis.HasErrorPrefix(err, "TRYAGAIN") {
		t.Fatalf("a batch on a migrating slot = %+v, %v; want TRYAGAIN, nothing run", res, err)
	}
	if n, err := node.LLen(ctx, k.Stock).Result(); err != nil || n != 2 {
		t.Fatalf("the stock after the refused batch holds %d, %v; want its 2 amounts", n, err)
	}
	if g, _ := node.HGet(ctx, k.Grants, "u9").Result(); g != "" {
		t.Fatalf("u9 holds %q after a refused batch", g)
	}
	// A confirm of a grant named alone in the deadline index (whose
	// removal empties that key) and of one named by a batch's member.
	confirms := []lua.ConfirmArg{{User: "u1", Serial: 1, Amount: one[0].Amount}, {User: "u2", Serial: 2, Amount: two[0].Amount}}
	if cr, errs, err := lua.ConfirmMany(ctx, node, &k, confirms); !redis.HasErrorPrefix(err, "TRYAGAIN") {
		t.Fatalf("a confirm on a migrating slot = %+v, %v, %v; want TRYAGAIN, nothing run", cr, errs, err)
	}
	if g, _ := node.HGet(ctx, k.Grants, "u1").Result(); len(g) < 2 || g[:2] != "h:" {
		t.Fatalf("u1's grant after the refused confirm = %q; want it held still", g)
	}
	if r, err := e.svc.Grab(ctx, "mig", "u9"); !errors.Is(err, grab.ErrOutcomeUnknown) && !errors.Is(err, grab.ErrUnavailable) {
		t.Fatalf("a grab on a migrating slot = %+v, %v; want a 503 (unavailable, or an outcome not known), never a grant", r, err)
	}
	if g, _ := node.HGet(ctx, k.Grants, "u9").Result(); g != "" {
		t.Fatalf("u9 holds %q after the grab path met the migrating slot", g)
	}
	if m, err := node.HMGet(ctx, k.Meta, "stock_count", "held_count").Result(); err != nil || m[0] != "2" || m[1] != "3" {
		t.Fatalf("the counters on the migrating slot: stock, held = %v, %v; want 2, 3 as before", m, err)
	}

	stable()
	res, err = claim(node, batch...)
	if err != nil || res[0].Outcome != lua.Granted || res[1].Outcome != lua.Already {
		t.Fatalf("the batch once the slot is stable = %+v, %v; want u9 granted, u1 already", res, err)
	}
	audit()
}
