package grab_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// TestLaneSkipsLingersThatTakeInNothing: a burst of concurrent grabs, then
// one grab alone, in turn, as an open loop below saturation sends them:
// after each burst the lane expects as many claims as it answered, lingers
// for them when the lone grab comes, and none come. Its lingers soon take
// in too little to be worth it, and it skips them (lingerGain), trying
// one now and then; every grab is granted. (A pool of a million packets:
// the wait holds even if the process stays short of CPU, and lingers, for
// most of it.)
func TestLaneSkipsLingersThatTakeInNothing(t *testing.T) {
	e := newEnv(t, 1, redistest.Options{AOF: true, Fsync: "always"})
	e.preload(t, rain.Spec{PoolID: "p", TotalCents: 1_000_000, Count: 1_000_000, HoldSeconds: 3600})
	ctx := context.Background()
	n := 0
	grabNew := func(user string) { // a new user's grab, granted
		if r, err := e.svc.Grab(ctx, "p", user); err != nil || r.Outcome != grab.Granted {
			t.Errorf("grab of %s = %+v, %v; want granted", user, r, err)
		}
	}
	grabOne := func() {
		n++
		grabNew(fmt.Sprintf("u%d", n))
	}
	burst := func() {
		var wg sync.WaitGroup
		for range 8 {
			n++
			user := fmt.Sprintf("u%d", n)
			wg.Go(func() { grabNew(user) })
		}
		wg.Wait()
	}
	stats := func() grab.ShardStats { return e.svc.ShardStats()[0] }
	waittest.Until(t, 60*time.Second, "a linger made and one skipped", func() bool {
		burst()
		grabOne()
		st := stats()
		return t.Failed() || (st.LingerSkipped >= 1 && st.Lingered >= 1)
	})
	if t.Failed() {
		return
	}
	// Once the lingers have not paid, the lane skips them, trying one now
	// and then (lingerProbeAfter): each round makes about two decisions
	// (one in the burst, one for the lone grab), and the lone grab's
	// linger can take in nothing.
	const rounds = 40
	before := stats()
	for range rounds {
		burst()
		grabOne()
	}
	after := stats()
	lingered, skipped := after.Lingered-before.Lingered, after.LingerSkipped-before.LingerSkipped
	t.Logf("over %d rounds: lingered %d (took in %d claims), skipped %d", rounds, lingered, after.LingerClaims-before.LingerClaims, skipped)
	if skipped < rounds/2 || lingered < 1 || lingered > 10 {
		t.Errorf("over %d rounds of a burst and a lone grab the lane lingered %d times and skipped %d, want at least %d skipped and from 1 to 10 lingers (the probes)",
			rounds, lingered, skipped, rounds/2)
	}
	e.assertAudit(t, "p")
}
