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
