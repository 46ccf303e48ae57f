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
	"rain/internal/shard"
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
// which never comes). A round counts only when all the claims were queued
// while the first was still out (on a machine too busy for that, the
// round is tried again). Every grab is granted, and the money adds up.
func TestLaneLingersOnlyForSmallBatches(t *testing.T) {
	servers := redistest.StartN(t, 1, redistest.Options{})
	proxy := redisproxy.Start(t, servers[0].Addr)
	// A budget long enough to hold the first claim's answer back for 2 s
	// (its shard is not stalled, and its claims are not refused).
	e := envWithShards(t, servers, []string{proxy.Addr}, shard.Options{Timeout: 4 * time.Second}, 0, 0)
	e.preload(t, rain.Spec{PoolID: "p", TotalCents: 1_000_000, Count: 10_000, SubPools: 1})
	grab.HoldCPU(e.svc, true)
	name := e.shards.Names()[0]
	claims := redisproxy.Script(lua.SHA("claim_many"))
	ctx := context.Background()
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // a round cut short by a Fatal leaves its grabs running
	grabNew := func(user string) {
		wg.Go(func() {
			if r, err := e.svc.Grab(ctx, "p", user); err != nil || r.Outcome != grab.Granted {
				t.Errorf("grab of %s = %+v, %v; want granted", user, r, err)
			}
		})
	}
	queued := 2*grab.LingerFull + 8
	round := 0
	waittest.Until(t, 60*time.Second, "a round with every claim queued behind the first", func() bool {
		round++
		proxy.SetReplyDelay(claims, 2*time.Second)
		grabNew(fmt.Sprintf("r%d.first", round))
		var first int64
		waittest.Until(t, 10*time.Second, "the first claim sent", func() bool {
			first = grab.SentAt(e.svc, name)
			return first != 0 && grab.Queued(e.svc, name) == 0
		})
		// Counted from here: the first claim may have lingered alone (the
		// lane expects what an earlier round's last batch held), and the
		// lane counts a linger before it sends.
		before := e.svc.ShardStats()[0]
		for i := range queued {
			grabNew(fmt.Sprintf("r%d.u%d", round, i))
		}
		waittest.Until(t, 10*time.Second, fmt.Sprintf("%d claims queued, or the first answered", queued), func() bool {
			return grab.Queued(e.svc, name) == queued || grab.SentAt(e.svc, name) != first
		})
		// Read after the queue: the first batch was still out with every
		// claim queued, so the lane saw them all once it came back.
		held := grab.Queued(e.svc, name) == queued && grab.SentAt(e.svc, name) == first
		proxy.SetReplyDelay(claims, 0) // the first's answer stays held; the rest are not
		wg.Wait()
		if !held || t.Failed() {
			return t.Failed()
		}
		if after := e.svc.ShardStats()[0]; after.Lingered != before.Lingered {
			t.Errorf("the lane lingered %d times (taking in %d claims), want never: every batch after the first held %d claims or more",
				after.Lingered-before.Lingered, after.LingerClaims-before.LingerClaims, grab.LingerFull)
		}
		return true
	})
	e.assertAudit(t, "p")
}
