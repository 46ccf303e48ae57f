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
// one now and then; every grab is granted.
func TestLaneSkipsLingersThatTakeInNothing(t *testing.T) {
	e := newEnv(t, 1, redistest.Options{AOF: true, Fsync: "always"})
	e.preload(t, rain.Spec{PoolID: "p", TotalCents: 100_000, Count: 100_000, HoldSeconds: 3600})
	ctx := context.Background()
	n := 0
	grabOne := func() {
		n++
		r, err := e.svc.Grab(ctx, "p", fmt.Sprintf("u%d", n))
		if err != nil || r.Outcome != grab.Granted {
			t.Errorf("grab of u%d = %+v, %v; want granted", n, r, err)
		}
	}
	stats := func() grab.ShardStats { return e.svc.ShardStats()[0] }
	waittest.Until(t, 60*time.Second, "a linger made and one skipped", func() bool {
		var wg sync.WaitGroup
		for range 8 {
			n++
			user := fmt.Sprintf("u%d", n)
			wg.Go(func() {
				if r, err := e.svc.Grab(ctx, "p", user); err != nil || r.Outcome != grab.Granted {
					t.Errorf("grab of %s = %+v, %v; want granted", user, r, err)
				}
			})
		}
		wg.Wait()
		grabOne()
		st := stats()
		return t.Failed() || (st.LingerSkipped >= 1 && st.Lingered >= 1)
	})
	if t.Failed() {
		return
	}
	st := stats()
	t.Logf("lingered %d (took in %d claims), skipped %d", st.Lingered, st.LingerClaims, st.LingerSkipped)
	e.assertAudit(t, "p")
}
