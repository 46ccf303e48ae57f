package grab

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"rain/internal/lua"
	"rain/internal/redistest"
)

// grabRetrying grabs, retrying while the user has a spill in flight.
func grabRetrying(t *testing.T, s *Service, pool, user string) Result {
	t.Helper()
	for try := 0; ; try++ {
		r, err := s.Grab(context.Background(), pool, user)
		if errors.Is(err, ErrBusy) && try < 200 {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("Grab(%s, %s): %v", pool, user, err)
		}
		return r
	}
}

// TestSpillNoFalseSoldOut: 100 packets in 4 sub-pools, 100 users: every one
// gets a packet, whatever their home sub-pool.
func TestSpillNoFalseSoldOut(t *testing.T) {
	e := newEnv(t, 3, redistest.Options{})
	e.preload(t, Spec{PoolID: "spill", TotalCents: 10_000, Count: 100, SubPools: 4})
	var cents int64
	for u := range 100 {
		r := grabRetrying(t, e.svc, "spill", fmt.Sprintf("u%d", u))
		if r.Outcome != Granted {
			t.Fatalf("user %d of 100 got %+v, want granted: stock was left in a sibling", u, r)
		}
		cents += r.Amount
	}
	if cents != 10_000 {
		t.Fatalf("granted %d cents, want 10000", cents)
	}
	if r := grabRetrying(t, e.svc, "spill", "late"); r.Outcome != SoldOut {
		t.Fatalf("the 101st user got %+v, want sold_out", r)
	}
	st, _ := e.svc.Status(context.Background(), "spill")
	if st.HeldCount != 100 || st.RemainingCount != 0 {
		t.Fatalf("status %+v, want 100 held, none left", st)
	}
	e.assertAudit(t, "spill")
}

// TestSpillRace: many users race for the last packets across sub-pools:
// exactly the stock is granted, nobody twice.
func TestSpillRace(t *testing.T) {
	e := newEnv(t, 3, redistest.Options{})
	e.preload(t, Spec{PoolID: "race", TotalCents: 4_000, Count: 40, SubPools: 4})
	var mu sync.Mutex
	granted := map[string]Result{}
	var wg sync.WaitGroup
	for u := range 200 {
		wg.Go(func() {
			user := fmt.Sprintf("u%d", u)
			for range 2 { // each user twice, concurrently with everyone
				r := grabRetrying(t, e.svc, "race", user)
				if r.Outcome == Granted || r.Outcome == AlreadyGranted {
					mu.Lock()
					if prev, ok := granted[user]; ok && prev.Serial != r.Serial {
						t.Errorf("user %s got two grants: %+v and %+v", user, prev, r)
					}
					granted[user] = r
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	var cents int64
	for _, r := range granted {
		cents += r.Amount
	}
	if len(granted) != 40 || cents != 4_000 {
		t.Fatalf("%d users granted %d cents, want exactly the stock: 40, 4000", len(granted), cents)
	}
	e.assertAudit(t, "race")
}

// TestSpillCrashAtEveryStep: a grab dies after each step of the spill
// protocol; the reaper's recovery then leaves no cent lost or doubled, the
// audit stays ok throughout, and the user ends with at most one grant.
func TestSpillCrashAtEveryStep(t *testing.T) {
	for _, step := range []string{"reserved", "taken", "adopted", "acked"} {
		t.Run(step, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, 2, redistest.Options{})
			e.svc.spillValidity, e.svc.spillAge = 300*time.Millisecond, 200*time.Millisecond
			const count, total = 8, 800
			e.preload(t, Spec{PoolID: "crash", TotalCents: total, Count: count, SubPools: 4})
			crash := errors.New("crash")
			crashed := ""
			e.svc.spillHook = func(s string) error {
				if s == step && crashed == "" {
					crashed = "now"
					return crash
				}
				return nil
			}
			// Grab until a spill crashes at the step.
			granted := map[string]Result{}
			var victim string
			for u := 0; victim == "" && u < 1000; u++ {
				user := fmt.Sprintf("u%d", u)
				r, err := e.svc.Grab(ctx, "crash", user)
				switch {
				case errors.Is(err, crash):
					victim = user
				case err != nil:
					t.Fatal(err)
				case r.Outcome == Granted:
					granted[user] = r
				}
			}
			if victim == "" {
				t.Fatal("no grab reached a spill")
			}
			e.assertAudit(t, "crash") // consistent even mid-protocol

			time.Sleep(e.svc.spillValidity + e.svc.spillAge + 100*time.Millisecond)
			if _, err := e.svc.ReleaseExpired(ctx); err != nil {
				t.Fatalf("ReleaseExpired: %v", err)
			}
			e.assertAudit(t, "crash")
			// Nothing in flight is left, and the victim holds at most one grant.
			r := grabRetrying(t, e.svc, "crash", victim)
			if r.Outcome == Granted || r.Outcome == AlreadyGranted {
				granted[victim] = r
			}
			for u := 1000; len(granted) < count && u < 3000; u++ {
				user := fmt.Sprintf("u%d", u)
				if r := grabRetrying(t, e.svc, "crash", user); r.Outcome == Granted {
					granted[user] = r
				}
			}
			var cents int64
			for _, r := range granted {
				cents += r.Amount
			}
			if len(granted) != count || cents != total {
				t.Fatalf("after the crash at %q: %d grants, %d cents; want all %d packets, %d cents, each once", step, len(granted), cents, count, total)
			}
			st := e.status(t)
			if st.RemainingCount != 0 || st.HeldCount != count || st.HeldCents != total {
				t.Fatalf("status %+v, want everything held, nothing left or in flight", st)
			}
			e.assertAudit(t, "crash")
		})
	}
}

func (e *env) status(t *testing.T, pool ...string) *Status {
	t.Helper()
	id := "crash"
	if len(pool) > 0 {
		id = pool[0]
	}
	st, err := e.svc.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestSpillAdoptedThenRegrabbed: a grab dies after adopt, before the ack; its
// grant expires and is released, the user grabs again; only then does the
// reaper resolve the transfer. It must ack it (the grant was made), not put
// the amount back at the sibling a second time.
func TestSpillAdoptedThenRegrabbed(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 2, redistest.Options{})
	e.svc.spillValidity, e.svc.spillAge = 300*time.Millisecond, 200*time.Millisecond
	e.preload(t, Spec{PoolID: "re", TotalCents: 400, Count: 4, SubPools: 2, HoldSeconds: 1})
	crash := errors.New("crash")
	crashed := false
	e.svc.spillHook = func(s string) error {
		if s == "adopted" && !crashed {
			crashed = true
			return crash
		}
		return nil
	}
	var victim string
	for u := 0; victim == "" && u < 1000; u++ {
		user := fmt.Sprintf("u%d", u)
		if _, err := e.svc.Grab(ctx, "re", user); errors.Is(err, crash) {
			victim = user
		}
	}
	if victim == "" {
		t.Fatal("no grab reached a spill")
	}
	time.Sleep(1200 * time.Millisecond) // past the hold, T and the margin
	p, err := e.svc.pool(ctx, "re")
	if err != nil {
		t.Fatal(err)
	}
	h := home(victim, 2)
	if _, err := lua.ReleaseExpired(ctx, p.clients[h], &p.keys[h], 100); err != nil {
		t.Fatal(err)
	}
	if r := grabRetrying(t, e.svc, "re", victim); r.Outcome != Granted {
		t.Fatalf("the victim's grab after the release = %+v, want a new grant", r)
	}
	if _, err := e.svc.ReleaseExpired(ctx); err != nil {
		t.Fatal(err)
	}
	e.assertAudit(t, "re")
	st := e.status(t, "re")
	if st.RemainingCount+st.HeldCount+st.ConfirmedCount != 4 || st.RemainingCents+st.HeldCents+st.ConfirmedCents != 400 {
		t.Fatalf("status %+v: stock + held + confirmed must stay 4 packets, 400 cents", st)
	}
}
