package reaper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"rain"
	"rain/internal/catalog"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/lock"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.IgnoreProbe()) }

type env struct {
	servers []*redistest.Server
	shards  *shard.Set
	clients []redis.UniversalClient
	cat     *catalog.Catalog
	svc     *grab.Service
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ge := grabtest.Start(t, 3, redistest.Options{})
	return &env{servers: ge.Servers, shards: ge.Shards, clients: ge.Clients, cat: ge.Catalog, svc: ge.Service}
}

// grabAll preloads pool id and grabs every packet; it returns the grants by user.
func (e *env) grabAll(t *testing.T, id string, count int, hold int64) map[string]grab.Result {
	t.Helper()
	ctx := context.Background()
	if _, _, err := e.cat.Preload(ctx, rain.Spec{PoolID: id, TotalCents: int64(count) * 100, Count: int64(count), SubPools: 2, HoldSeconds: hold}); err != nil {
		t.Fatal(err)
	}
	// Users whose home sub-pool is already empty are sold out: go on with
	// more users until every packet is granted.
	out := map[string]grab.Result{}
	for i := 0; len(out) < count; i++ {
		user := fmt.Sprintf("%s-u%d", id, i)
		r, err := e.svc.Grab(ctx, id, user)
		if err != nil || i > 100*count {
			t.Fatalf("Grab(%s) = %+v, %v", user, r, err)
		}
		if r.Outcome == grab.Granted {
			out[user] = r
		}
	}
	return out
}

func (e *env) locker(ttl time.Duration) *lock.Locker {
	return lock.New(e.clients, lock.Config{TTL: ttl, RetryDelay: 20 * time.Millisecond})
}

func (e *env) status(t *testing.T, id string) *rain.Status {
	t.Helper()
	st, err := e.cat.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (e *env) assertAudit(t *testing.T, id string) {
	t.Helper()
	r, err := e.cat.Audit(context.Background(), id)
	if err != nil || !r.OK {
		t.Fatalf("Audit(%s) = %+v, %v", id, r, err)
	}
}

// waitDue waits until the shards' clock is past every grant's deadline.
func (e *env) waitDue(t *testing.T, grants map[string]grab.Result) {
	t.Helper()
	var last time.Time
	for _, g := range grants {
		if g.ExpiresAt.After(last) {
			last = g.ExpiresAt
		}
	}
	waittest.Until(t, 10*time.Second, "every grant past its deadline on the shards' clock", func() bool {
		now, err := e.clients[0].Time(context.Background()).Result()
		return err == nil && now.After(last)
	})
}

// start runs r until the test ends; stop ends it early.
func start(t *testing.T, r *Reaper) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// TestExpiredGrantsReleased: hold_seconds=2, 100 grants, 50 confirmed; the
// other 50 go back to the stock, and their users may grab again.
func TestExpiredGrantsReleased(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	grants := e.grabAll(t, "p", 100, 2)
	var confirmedCents, releasedCents int64
	expiring := map[string]grab.Result{}
	for user, g := range grants {
		if len(expiring) < 50 {
			expiring[user] = g
			releasedCents += g.Amount
			continue
		}
		if err := e.cat.Confirm(ctx, "p", user, g.Serial); err != nil {
			t.Fatalf("Confirm(%s): %v", user, err)
		}
		confirmedCents += g.Amount
	}
	r := New(e.shards, e.cat, e.locker(time.Second), Config{Interval: 100 * time.Millisecond})
	start(t, r)
	waittest.Until(t, 10*time.Second, "50 grants released", func() bool { return r.Stats().Released == 50 })

	st := e.status(t, "p")
	if st.RemainingCount != 50 || st.RemainingCents != releasedCents || st.ReleasedCount != 50 || st.ReleasedCents != releasedCents ||
		st.ConfirmedCount != 50 || st.ConfirmedCents != confirmedCents || st.HeldCount != 0 {
		t.Fatalf("status after the release = %+v; want 50 back in stock (%d cents), 50 confirmed (%d cents), none held", st, releasedCents, confirmedCents)
	}
	if got := r.Stats().ReleasedCents; got != releasedCents {
		t.Fatalf("ReleasedCents = %d, want %d", got, releasedCents)
	}
	e.assertAudit(t, "p")
	for user, g := range expiring {
		if err := e.cat.Confirm(ctx, "p", user, g.Serial); !errors.Is(err, rain.ErrGrantReleased) {
			t.Fatalf("Confirm of %s's released grant = %v, want ErrGrantReleased", user, err)
		}
		again, err := e.svc.Grab(ctx, "p", user)
		if err != nil || again.Outcome != grab.Granted || again.Serial == g.Serial {
			t.Fatalf("Grab by released user %s = %+v, %v; want a new grant", user, again, err)
		}
	}
	e.assertAudit(t, "p")
}

// TestTwoSweepsAtOnce: two reapers forced to run at once, without the lock,
// never release a grant twice.
func TestTwoSweepsAtOnce(t *testing.T) {
	e := newEnv(t)
	grants := e.grabAll(t, "p", 400, 1)
	var cents int64
	for _, g := range grants {
		cents += g.Amount
	}
	e.waitDue(t, grants)
	var mu sync.Mutex
	var released, releasedCents int64
	var wg sync.WaitGroup
	for range 2 {
		r := New(e.shards, e.cat, nil, Config{})
		wg.Go(func() {
			for range 20 {
				sw, err := r.Sweep(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				released += sw.Released
				releasedCents += sw.ReleasedCents
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if released != 400 || releasedCents != cents {
		t.Fatalf("two sweeps released %d grants, %d cents; want each grant once: 400, %d", released, releasedCents, cents)
	}
	st := e.status(t, "p")
	if st.RemainingCount != 400 || st.RemainingCents != cents {
		t.Fatalf("status = %+v, want all 400 packets back, %d cents", st, cents)
	}
	e.assertAudit(t, "p")
}

// TestTakeoverAfterKill: the leading reaper's process dies mid-sweep
// without releasing its lock (it is cut off from every shard: a partition,
// which to the shards is a process that died); another instance takes over
// within the lock's TTL and releases what is due.
func TestTakeoverAfterKill(t *testing.T) {
	const ttl = 600 * time.Millisecond
	e := newEnv(t)
	proxies := make([]*redisproxy.Proxy, len(e.servers))
	addrs := make([]string, len(e.servers))
	for i, srv := range e.servers {
		proxies[i] = redisproxy.Start(t, srv.Addr)
		addrs[i] = proxies[i].Addr
	}
	doomed := grabtest.On(t, e.servers, addrs)
	a := New(doomed.Shards, doomed.Catalog, lock.New(doomed.Clients, lock.Config{TTL: ttl, RetryDelay: 20 * time.Millisecond}), Config{Interval: 50 * time.Millisecond})
	start(t, a)
	waittest.Until(t, 5*time.Second, "a leads", func() bool { return a.Stats().Leader })

	b := New(e.shards, e.cat, e.locker(ttl), Config{Interval: 50 * time.Millisecond})
	start(t, b)
	e.grabAll(t, "p", 20, 1)
	if b.Stats().Leader {
		t.Fatal("b leads while a holds the lock")
	}
	for _, p := range proxies {
		p.Partition() // a dies: its lock is neither extended nor released
	}
	took := waittest.Until(t, ttl+2*time.Second, "b takes over", func() bool { return b.Stats().Leader })
	t.Logf("b took over %v after a died (TTL %v)", took, ttl)
	waittest.Until(t, 5*time.Second, "b releases the expired grants", func() bool { return b.Stats().Released == 20 })
	e.assertAudit(t, "p")
}

// TestLostLockStopsSweeping: when the lock is taken away, the reaper stops
// leading at once and competes again.
func TestLostLockStopsSweeping(t *testing.T) {
	const ttl = 600 * time.Millisecond
	e := newEnv(t)
	r := New(e.shards, e.cat, e.locker(ttl), Config{Interval: 20 * time.Millisecond})
	start(t, r)
	waittest.Until(t, 5*time.Second, "r leads", func() bool { return r.Stats().Leader })
	for _, c := range e.clients {
		if err := c.Del(context.Background(), "rain:reaper").Err(); err != nil {
			t.Fatal(err)
		}
	}
	waittest.Until(t, ttl, "the loss is noticed", func() bool { return r.Stats().LostLocks == 1 })
	waittest.Until(t, 5*time.Second, "r leads again", func() bool { return r.Stats().Leader && r.Stats().Acquisitions == 2 })
}
