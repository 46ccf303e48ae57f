package grab_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/pool"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/shard/shardtest"
)

// TestAFrozenShardHoldsItsShareOfThePlaces: with few request places (16
// workers and a queue of 32, as a small rain serve has), a frozen shard's
// users hold at most its share of them while they run short (the
// bulkhead's crowding rule: invariant 8), so the users of the three
// healthy shards, grabbing at the same pace, are neither shed nor refused.
// Without the rule the frozen shard's claims, each waiting out the budget,
// take every place within its first half second.
func TestAFrozenShardHoldsItsShareOfThePlaces(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 4, redistest.Options{})
	set := shardtest.Open(t, redistest.Addrs(servers), shard.Options{}) // rain serve's options
	workers, err := pool.New(pool.Config{Min: 16, Max: 16, Queue: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { workers.Close(5 * time.Second) })
	_, cat, svc := grabtest.Service(t, set, grab.Config{Places: workers.Places})
	st, _, err := cat.Preload(ctx, rain.Spec{PoolID: "crowd", TotalCents: 1_000_000, Count: 10_000, SubPools: 8})
	if err != nil {
		t.Fatal(err)
	}
	// The frozen shard: one of the pool's, not s1 (the serial shard).
	bad := ""
	for _, sp := range st.SubPools {
		if sp.Shard != "s1" {
			bad = sp.Shard
			break
		}
	}
	p, err := cat.Cached(ctx, "crowd")
	if err != nil {
		t.Fatal(err)
	}
	onBad := func(user string) bool { return p.Placement[p.Home(user)] == bad }
	servers[slices.Index(set.Names(), bad)].Pause()
	t.Cleanup(servers[slices.Index(set.Names(), bad)].Resume)

	var shed, refused, crowded atomic.Int64
	var mu sync.Mutex
	var healthyFailures []string
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := range 800 { // 800 grabs in about a second, a quarter of them the frozen shard's
		<-tick.C
		user := fmt.Sprintf("u%d", i)
		wg.Go(func() {
			if !workers.Admit() {
				shed.Add(1)
				if !onBad(user) {
					mu.Lock()
					healthyFailures = append(healthyFailures, user+": shed")
					mu.Unlock()
				}
				return
			}
			defer workers.Leave()
			var pending grab.Pending
			if err := workers.Run(ctx, func(ctx context.Context) { pending = svc.Begin(ctx, "crowd", user) }); err != nil {
				t.Errorf("run: %v", err)
				return
			}
			r, err := pending.Wait()
			if onBad(user) {
				if errors.Is(err, grab.ErrUnavailable) && strings.Contains(err.Error(), "its share of the requests in flight") {
					crowded.Add(1)
				}
				return
			}
			if err != nil || r.Outcome != grab.Granted {
				refused.Add(1)
				mu.Lock()
				healthyFailures = append(healthyFailures, fmt.Sprintf("%s: %+v, %v", user, r, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(healthyFailures) > 0 {
		t.Fatalf("%d users of healthy shards shed or refused (%d shed in all), e.g. %v", len(healthyFailures), shed.Load(), healthyFailures[:min(5, len(healthyFailures))])
	}
	if crowded.Load() == 0 {
		t.Fatalf("no claim of the frozen shard %s was refused for holding its share of the places: the places never ran short", bad)
	}
	t.Logf("frozen shard %s: %d of its claims refused for its share; %d shed in all", bad, crowded.Load(), shed.Load())
}
