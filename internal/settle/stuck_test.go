package settle_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/wait/waittest"
)

// TestOneStuckOutboxSlowsNoOther: one sub-pool whose confirms keep failing
// (its grant's record garbled on the shard: confirm_many answers an error
// for it, every pass) waits its own backoff; pool b,
// on the same shard with a hold of 2 s, has every grant confirmed before
// its deadline meanwhile. Before, the stuck sub-pool's failures doubled the
// whole shard's wait between passes, up to MaxRetryDelay (8 s here, 15 s
// by default), and b's grants waited past their hold. Once the stuck
// sub-pool's record is back, its grant is confirmed and paid too: nothing
// was acknowledged while it failed.
func TestOneStuckOutboxSlowsNoOther(t *testing.T) {
	ge := grabtest.Start(t, 1, redistest.Options{})
	ctx := context.Background()
	for _, s := range []rain.Spec{
		{PoolID: "a", TotalCents: 500, Count: 5, SubPools: 1},
		{PoolID: "b", TotalCents: 500, Count: 5, SubPools: 1, HoldSeconds: 2},
	} {
		if _, _, err := ge.Catalog.Preload(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	grabAll(t, ge.Service, "a", "u", 1)
	subs, err := ge.Catalog.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var stuck rain.Keys
	for _, sp := range subs {
		if sp.Pool == "a" {
			stuck = sp.Keys()
		}
	}
	c := ge.Shards.Client(subs[0].Shard)
	rec, err := c.HGet(ctx, stuck.Grants, "u0").Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, stuck.Grants, "u0", "garbled").Err(); err != nil {
		t.Fatal(err)
	}

	sink := newMemSink(0)
	cfg := fastConfig("a")
	cfg.RetryDelay, cfg.MaxRetryDelay = 50*time.Millisecond, 8*time.Second
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	// Seven failed passes in a row: the shard's own backoff was past 3 s
	// from then on.
	waittest.Until(t, 30*time.Second, "a's confirm refused seven times", func() bool { return w.Stats().Failures >= 7 })

	for i := range 4 {
		r, err := ge.Service.Grab(ctx, "b", fmt.Sprintf("v%d", i))
		if err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab of b by v%d = %+v, %v", i, r, err)
		}
		deadline := r.ExpiresAt
		waittest.Until(t, 20*time.Second, "b's grant confirmed", func() bool {
			st, err := ge.Catalog.Status(ctx, "b")
			return err == nil && st.ConfirmedCount == int64(i+1)
		})
		if late := time.Since(deadline); late > 0 {
			t.Fatalf("b's grant %d confirmed %v after its deadline, while a's confirms failed", i, late)
		}
	}
	if paid, _ := sink.stats(); paid != 4 {
		t.Fatalf("%d grants paid while a's confirms failed, want b's 4", paid)
	}

	if err := c.HSet(ctx, stuck.Grants, "u0", rec).Err(); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 30*time.Second, "a's grant paid once its record is back", func() bool {
		paid, _ := sink.stats()
		return paid == 5
	})
	if st, err := ge.Catalog.Status(ctx, "a"); err != nil || st.ConfirmedCount != 1 {
		t.Fatalf("a: %+v, %v; want its grant confirmed", st, err)
	}
}
