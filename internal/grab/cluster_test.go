package grab_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/lua"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

// clusterEnv is a Service on one cluster shard c1 of 3 primaries.
func clusterEnv(t *testing.T, replicas int) (*env, *redistest.Cluster) {
	t.Helper()
	cl := redistest.StartCluster(t, 3, replicas, redistest.Options{AOF: true, Fsync: "always"})
	specs, err := shard.ParseSpecs("c1=1@cluster/" + cl.Seeds())
	if err != nil {
		t.Fatal(err)
	}
	set, err := shard.Open(specs, 0, shard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	e := &env{servers: cl.Nodes, shards: set}
	e.svc, e.cat = e.service(t, set)
	return e, cl
}

// TestClusterPlacesOverPrimaries: on a cluster shard of three primaries a
// pool's sub-pools spread over the primaries (one each), users grab
// through each primary's lane, and the audit is ok.
func TestClusterPlacesOverPrimaries(t *testing.T) {
	ctx := context.Background()
	e, _ := clusterEnv(t, 0)
	st := e.preload(t, rain.Spec{PoolID: "cl", TotalCents: 30_000, Count: 300, SubPools: 3})
	if len(st.SubPools) != 3 {
		t.Fatalf("%d sub-pools, want 3", len(st.SubPools))
	}
	p, err := e.cat.Read(ctx, "cl")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]bool{}
	for j := range p.SubPools() {
		addr, err := e.shards.Owner(ctx, "c1", p.SubPool(j).Keys().Meta)
		if err != nil {
			t.Fatal(err)
		}
		owners[addr] = true
	}
	if len(owners) != 3 {
		t.Fatalf("the sub-pools' slots are on %d primaries, want 3: %v", len(owners), owners)
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for u := range 40 {
				r, err := e.svc.Grab(ctx, "cl", fmt.Sprintf("u%d-%d", g, u))
				if err != nil && !errors.Is(err, grab.ErrBusy) {
					t.Errorf("grab: %v", err)
					return
				}
				if r.Outcome == grab.Granted {
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if granted.Load() != 300 {
		t.Fatalf("%d granted of 300 packets by 320 users", granted.Load())
	}
	stats := e.svc.ShardStats()
	if len(stats) != 3 {
		t.Fatalf("claim lanes %+v, want one per primary", stats)
	}
	e.assertAudit(t, "cl")
	_ = time.Second
}

// TestClusterReshardMidRain: while users grab a pool spread over a
// cluster's three primaries, the slot of one sub-pool moves to another
// primary (its keys migrated a few at a time: claims meet ASK and
// TRYAGAIN meanwhile, and MOVED after), then a fourth primary joins and
// the cluster is rebalanced (redis-cli --cluster rebalance) under the
// flood. No grab fails for any other reason than a 503 rain can name
// (unavailable, outcome unknown: the client retries), grabs on the moved
// sub-pool go on within a second of the move, every user's re-grab
// returns their one grant, and the audit is ok.
//
// It runs with the grants written in both forms: under the batch form the
// claim scripts' keys all exist, so a migrating node runs them (see
// TestScriptsRefusedOnAMigratingSlot); under the default one a key they
// declare does not, and it refuses them before they run.
func TestClusterReshardMidRain(t *testing.T) {
	for _, c := range []struct {
		name string
		form lua.Form
	}{{"grant form", lua.Form{}}, {"batch form", lua.Form{Outbox: lua.OutboxBatch, BatchedDeadlines: true}}} {
		t.Run(c.name, func(t *testing.T) { reshardMidRain(t, c.form) })
	}
}

func reshardMidRain(t *testing.T, form lua.Form) {
	ctx := context.Background()
	e, cl := clusterEnv(t, 0)
	_, e.cat, e.svc = grabtest.Service(t, e.shards, grab.Config{SpillValidity: e.valid, Form: form})
	st := e.preload(t, rain.Spec{PoolID: "move", TotalCents: 3_000_000, Count: 300_000})
	if len(st.SubPools) != 3 {
		t.Fatalf("%d sub-pools for 300,000 packets on 3 primaries, want 3 (the primaries count as shards)", len(st.SubPools))
	}
	p, err := e.cat.Read(ctx, "move")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	grants := map[string]grab.Result{}
	var other []error
	var lastHome0 atomic.Int64 // unix ns of the last grant to a user of sub-pool 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				user := fmt.Sprintf("u%d", next.Add(1))
				r, err := e.svc.Grab(ctx, "move", user)
				mu.Lock()
				switch {
				case err == nil && r.Outcome == grab.Granted:
					grants[user] = r
					if p.Home(user) == 0 {
						lastHome0.Store(time.Now().UnixNano())
					}
				case err == nil, errors.Is(err, grab.ErrUnavailable), errors.Is(err, grab.ErrOutcomeUnknown), errors.Is(err, grab.ErrBusy):
				default:
					other = append(other, err)
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond) // a steady rain, not a flood
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	k0 := p.SubPool(0).Keys()
	slot := shard.Slot(k0.Meta)
	to := cl.OtherPrimary(cl.Owner(slot))
	cl.MoveSlot(slot, to, 20*time.Millisecond)
	moved := time.Now()
	waittest.Until(t, 30*time.Second, "a grant on the moved sub-pool after the move", func() bool {
		return lastHome0.Load() >= moved.UnixNano()
	})
	// A claim that met ASK while the slot moved may be the first grant
	// after it; the slot map follows at the next MOVED, which the rain
	// meets soon after.
	waittest.Until(t, 5*time.Second, "the client's slot map naming the new owner of sub-pool 0", func() bool {
		owner, err := e.shards.Owner(ctx, "c1", k0.Meta)
		return err == nil && owner == to.Addr
	})
	var redirected int64
	for _, s := range e.svc.ShardStats() {
		redirected += s.Redirected
	}
	if redirected == 0 {
		t.Error("no claim met a redirect across the move: the move was not under the rain")
	}
	began := time.Now()
	cl.AddPrimary()
	cl.Rebalance()
	t.Logf("a fourth primary joined and took its share of the slots in %v", time.Since(began).Round(time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("%d grabs failed otherwise than a 503; the first: %v", len(other), other[0])
	}
	for user, r := range grants {
		again, err := e.svc.Grab(ctx, "move", user)
		if err != nil || again.Outcome != grab.AlreadyGranted || again.Serial != r.Serial || again.Amount != r.Amount {
			t.Fatalf("re-grab of %s = %+v, %v; want already granted %+v", user, again, err, r)
		}
	}
	t.Logf("%d grants through a slot move and a rebalance onto a fourth primary", len(grants))
	e.assertAudit(t, "move")
}
