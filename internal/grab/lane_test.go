package grab_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/lua"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// TestLaneLingersOnlyShortOfCPU: rounds of a burst of concurrent grabs and
// then one grab alone. After each burst the lane expects as many claims as
// it answered. With CPU to spare (the CPU watch held so) it sends the lone
// claim at once, not once lingering; short of CPU (held so) it lingers for
// the claims it expects. Every grab is granted, and the pool's money adds
// up.
func TestLaneLingersOnlyShortOfCPU(t *testing.T) {
	e := newEnv(t, 1, redistest.Options{AOF: true, Fsync: "always"})
	e.preload(t, rain.Spec{PoolID: "p", TotalCents: 1_000_000, Count: 1_000_000, HoldSeconds: 3600})
	ctx := context.Background()
	n := 0
	grabNew := func(user string) { // a new user's grab, granted
		if r, err := e.svc.Grab(ctx, "p", user); err != nil || r.Outcome != grab.Granted {
			t.Errorf("grab of %s = %+v, %v; want granted", user, r, err)
		}
	}
	round := func() {
		var wg sync.WaitGroup
		for range 8 {
			n++
			user := fmt.Sprintf("u%d", n)
			wg.Go(func() { grabNew(user) })
		}
		wg.Wait()
		n++
		grabNew(fmt.Sprintf("u%d", n))
	}
	stats := func() grab.ShardStats { return e.svc.ShardStats()[0] }

	grab.HoldCPU(e.svc, false)
	waittest.Until(t, 60*time.Second, "a linger skipped with CPU to spare", func() bool {
		round()
		return t.Failed() || stats().LingerSkipped >= 1
	})
	for range 20 {
		round()
	}
	if st := stats(); st.Lingered != 0 {
		t.Errorf("with CPU to spare the lane lingered %d times (and skipped %d), want never", st.Lingered, st.LingerSkipped)
	}

	grab.HoldCPU(e.svc, true)
	waittest.Until(t, 60*time.Second, "a linger made short of CPU", func() bool {
		round()
		return t.Failed() || stats().Lingered >= 1
	})
	t.Logf("lingered %d (took in %d claims), skipped %d", stats().Lingered, stats().LingerClaims, stats().LingerSkipped)
	e.assertAudit(t, "p")
}

// TestLaneLingersOnlyForSmallBatches: short of CPU, a lane lingers only
// for a batch of fewer than LingerFull claims, and only until it holds
// that many. A claim goes out alone, its answer held back at a proxy;
// 2×LingerFull+8 claims queue behind it. Once it is answered the lane
// expects them all, but no more than LingerFull, and sends the queued ones
// at once: a batch that already holds LingerFull claims waits for nothing
// (a lane that expected every claim it had seen would wait for one more,
// which never comes). Every grab is granted, and the money adds up.
func TestLaneLingersOnlyForSmallBatches(t *testing.T) {
	e, proxies := newProxiedEnv(t, 1, redistest.Options{})
	e.preload(t, rain.Spec{PoolID: "p", TotalCents: 1_000_000, Count: 10_000, SubPools: 1})
	grab.HoldCPU(e.svc, true)
	shard := e.shards.Names()[0]
	claims := redisproxy.Script(lua.SHA("claim_many"))
	proxies[0].SetReplyDelay(claims, e.shards.Timeout()*6/10) // within the budget: never refused
	ctx := context.Background()
	var wg sync.WaitGroup
	grabNew := func(user string) {
		wg.Go(func() {
			if r, err := e.svc.Grab(ctx, "p", user); err != nil || r.Outcome != grab.Granted {
				t.Errorf("grab of %s = %+v, %v; want granted", user, r, err)
			}
		})
	}
	grabNew("first")
	waittest.Until(t, 10*time.Second, "the first claim sent", func() bool {
		return grab.Sending(e.svc, shard) && grab.Queued(e.svc, shard) == 0
	})
	queued := 2*grab.LingerFull + 8
	for i := range queued {
		grabNew(fmt.Sprintf("u%d", i))
	}
	waittest.Until(t, 10*time.Second, fmt.Sprintf("%d claims queued behind the first", queued), func() bool {
		return grab.Queued(e.svc, shard) == queued
	})
	wg.Wait()
	if st := e.svc.ShardStats()[0]; st.Lingered != 0 {
		t.Errorf("the lane lingered %d times (taking in %d claims), want never: every batch after the first held %d claims or more",
			st.Lingered, st.LingerClaims, grab.LingerFull)
	}
	e.assertAudit(t, "p")
}
