package grab_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// TestArbiterRestartedEmpty: the arbiter (s1, the serial shard) loses its
// data and restarts empty while a pool placed on the other shards is live.
// Its registry is empty and its copy of the record gone, but the pool does
// not vanish: no grab is ever answered not_found, neither on an instance
// that had the pool cached nor on one that starts afterwards; users keep
// their grants, new users are granted; and the registry refresh writes the
// record and the registry entry back to the arbiter.
func TestArbiterRestartedEmpty(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{}) // no AOF: a restart comes back empty
	// A pool whose sub-pools are on s2 and s3: the arbiter holds only its
	// record and registry entry.
	id := ""
	for i := 0; id == ""; i++ {
		if c := fmt.Sprintf("live%d", i); !slices.Contains(e.shards.Ring().Distinct(c, 2), "s1") {
			id = c
		}
	}
	e.preload(t, rain.Spec{PoolID: id, TotalCents: 100_000, Count: 1000, SubPools: 2})
	warm := e.svc
	e.run(t, warm)
	first := map[string]grab.Result{}
	for u := range 10 {
		user := fmt.Sprintf("u%d", u)
		r, err := warm.Grab(ctx, id, user)
		if err != nil || r.Outcome != grab.Granted {
			t.Fatalf("Grab(%s) = %+v, %v; want granted", user, r, err)
		}
		first[user] = r
	}

	arbiter := e.servers[0]
	arbiter.Kill()
	arbiter.Restart()
	if n, err := e.shards.Client("s1").Exists(ctx, "rain:{"+id+"}:pool", "rain:pools").Result(); err != nil || n != 0 {
		t.Fatalf("the restarted arbiter holds %d of the record and the registry (%v), want none", n, err)
	}
	cold, _ := e.service(t, e.shards) // an instance started after the loss
	e.run(t, cold)
	grabOf := func(s *grab.Service, user string) grab.Result {
		t.Helper()
		for {
			r, err := s.Grab(ctx, id, user)
			if err == nil {
				if r.Outcome == grab.NotFound {
					t.Fatalf("Grab(%s) of the live pool = not_found after the arbiter lost its data", user)
				}
				return r
			}
			// A shard that has just restarted may refuse a moment (its
			// breaker); the answer is then 503, never 404.
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, s := range []*grab.Service{warm, cold} {
		for user, r := range first {
			if again := grabOf(s, user); again.Outcome != grab.AlreadyGranted || again.Serial != r.Serial || again.Amount != r.Amount {
				t.Fatalf("re-grab of %s = %+v, want already_granted %+v", user, again, r)
			}
		}
		for u := range 10 {
			if r := grabOf(s, fmt.Sprintf("new%p-%d", s, u)); r.Outcome != grab.Granted {
				t.Fatalf("grab of a new user = %+v, want granted", r)
			}
		}
	}
	waittest.Until(t, 10*time.Second, "the arbiter's record and registry entry restored", func() bool {
		n, err := e.shards.Client("s1").Exists(ctx, "rain:{"+id+"}:pool").Result()
		in, err2 := e.shards.Client("s1").SIsMember(ctx, "rain:pools", id).Result()
		return err == nil && err2 == nil && n == 1 && in
	})
	st, err := e.cat.Status(ctx, id)
	if err != nil || st.State != string(rain.Open) || st.HeldCount != 30 {
		t.Fatalf("Status = %+v, %v; want open with 30 held", st, err)
	}
	e.assertAudit(t, id)
}
