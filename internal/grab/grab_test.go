package grab_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rain"
	"rain/internal/catalog"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/reaper"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/shard/shardtest"
	"rain/internal/wait/waittest"
)

// IgnoreCurrent: ants (the worker pool, bulkhead_test.go) starts a default
// pool of its own at init.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent(), redistest.IgnoreProbe())
}

// env is a Service on real redis-server shards, wired as every test of
// the packages rain serve is built from wires it (internal/grabtest), with
// the catalogue and the reaper of the same instance.
type env struct {
	servers []*redistest.Server
	shards  *shard.Set
	cat     *catalog.Catalog
	svc     *grab.Service
	sweeper *reaper.Reaper // passes on demand: sweep
	valid   time.Duration  // spill reservations' validity (T); 0: the default
}

func newEnv(t testing.TB, n int, opts redistest.Options) *env {
	t.Helper()
	servers := redistest.StartN(t, n, opts)
	return envOn(t, servers, redistest.Addrs(servers))
}

// envOn is a Service on servers, reached at addrs (the servers' own, or
// proxies in front of them), with shards named s1, s2, ...
func envOn(t testing.TB, servers []*redistest.Server, addrs []string) *env {
	t.Helper()
	return envWith(t, servers, addrs, 0, 0)
}

// envWith is envOn with the spill's validity T and age before recovery
// (0: the defaults), which tests shorten.
func envWith(t testing.TB, servers []*redistest.Server, addrs []string, valid, age time.Duration) *env {
	t.Helper()
	return envWithShards(t, servers, addrs, shard.Options{}, valid, age)
}

// envWithShards is envWith with the shards opened with opts.
func envWithShards(t testing.TB, servers []*redistest.Server, addrs []string, opts shard.Options, valid, age time.Duration) *env {
	t.Helper()
	e := &env{servers: servers, shards: shardtest.Open(t, addrs, opts), valid: valid}
	_, e.cat, e.svc = grabtest.Service(t, e.shards, grab.Config{SpillValidity: valid})
	e.sweeper = reaper.New(e.shards, e.cat, nil, reaper.Config{SpillValidity: valid, SpillAge: age})
	return e
}

// service is one more rain instance's grab path on set (grabtest.Service),
// with env's spill validity.
func (e *env) service(t testing.TB, set *shard.Set) (*grab.Service, *catalog.Catalog) {
	t.Helper()
	_, cat, svc := grabtest.Service(t, set, grab.Config{SpillValidity: e.valid})
	return svc, cat
}

// sweep makes one pass of the reaper over every sub-pool.
func (e *env) sweep(t testing.TB) reaper.Sweep {
	t.Helper()
	sw, err := e.sweeper.Sweep(context.Background())
	if err != nil {
		t.Fatalf("reaper sweep: %v", err)
	}
	return sw
}

// waitShardClock waits until s1's clock (the one the scripts read) is past
// at.
func (e *env) waitShardClock(t testing.TB, at time.Time) {
	t.Helper()
	waittest.Until(t, 10*time.Second, "the shards' clock past "+at.Format(time.StampMilli), func() bool {
		now, err := e.shards.Client("s1").Time(context.Background()).Result()
		return err == nil && now.After(at)
	})
}

func (e *env) preload(t testing.TB, spec rain.Spec) *rain.Status {
	t.Helper()
	st, created, err := e.cat.Preload(context.Background(), spec)
	if err != nil {
		t.Fatalf("Preload(%+v): %v", spec, err)
	}
	if !created {
		t.Fatalf("Preload(%+v): created = false, want true", spec)
	}
	return st
}

func (e *env) assertAudit(t testing.TB, pool string) {
	t.Helper()
	r, err := e.cat.Audit(context.Background(), pool)
	if err != nil {
		t.Fatalf("Audit(%s): %v", pool, err)
	}
	if !r.OK {
		t.Fatalf("Audit(%s) problems: %v", pool, r.Problems)
	}
}

func TestPreloadAndGrab(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{})
	st := e.preload(t, rain.Spec{PoolID: "p1", TotalCents: 1000, Count: 10})
	if st.RemainingCount != 10 || st.RemainingCents != 1000 || st.State != string(rain.Open) || len(st.SubPools) != 1 {
		t.Fatalf("Status after preload = %+v, want 10 packets, 1000 cents, open, 1 sub-pool", st)
	}

	var sum int64
	first := map[string]grab.Result{}
	for i := range 10 {
		user := fmt.Sprintf("u%d", i)
		r, err := e.svc.Grab(ctx, "p1", user)
		if err != nil || r.Outcome != grab.Granted {
			t.Fatalf("Grab(p1, %s) = %+v, %v; want granted", user, r, err)
		}
		if r.Amount < 1 || r.Serial <= 0 || time.Until(r.ExpiresAt) < 590*time.Second {
			t.Fatalf("Grab(p1, %s) = %+v: want amount ≥ 1, serial > 0, expiry ~600s ahead", user, r)
		}
		sum += r.Amount
		first[user] = r
	}
	if sum != 1000 {
		t.Fatalf("granted cents = %d, want 1000", sum)
	}
	for user, want := range first {
		r, err := e.svc.Grab(ctx, "p1", user)
		if err != nil || r.Outcome != grab.AlreadyGranted || r.Amount != want.Amount || r.Serial != want.Serial || !r.ExpiresAt.Equal(want.ExpiresAt) {
			t.Fatalf("repeat Grab(p1, %s) = %+v, %v; want already_granted with %+v", user, r, err, want)
		}
	}
	if r, err := e.svc.Grab(ctx, "p1", "late"); err != nil || r.Outcome != grab.SoldOut {
		t.Fatalf("Grab after sell-out = %+v, %v; want sold_out", r, err)
	}
	if r, err := e.svc.Grab(ctx, "nope", "u1"); err != nil || r.Outcome != grab.NotFound {
		t.Fatalf("Grab(unknown pool) = %+v, %v; want not_found", r, err)
	}
	st, err := e.cat.Status(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if st.RemainingCount != 0 || st.HeldCount != 10 || st.HeldCents != 1000 {
		t.Fatalf("Status after sell-out = %+v, want 0 left, 10 held, 1000 cents held", st)
	}
	e.assertAudit(t, "p1")
}

func TestScriptCacheFlushed(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 1, redistest.Options{})
	e.preload(t, rain.Spec{PoolID: "p", TotalCents: 100, Count: 10})
	if err := e.shards.Client("s1").ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := e.svc.Grab(ctx, "p", "u"); err != nil || r.Outcome != grab.Granted {
		t.Fatalf("Grab after SCRIPT FLUSH = %+v, %v; want granted (EVAL fallback)", r, err)
	}
}

func TestWindow(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 1, redistest.Options{})
	soon := time.Now().Add(time.Hour)
	e.preload(t, rain.Spec{PoolID: "later", TotalCents: 100, Count: 10, StartsAt: &soon})
	r, err := e.svc.Grab(ctx, "later", "u")
	if err != nil || r.Outcome != grab.NotStarted || r.RetryAfter < 59*time.Minute || r.RetryAfter > time.Hour {
		t.Fatalf("Grab before start = %+v, %v; want not_started, retry in ~1h", r, err)
	}
	past, end := time.Now().Add(-time.Hour), time.Now().Add(300*time.Millisecond)
	e.preload(t, rain.Spec{PoolID: "brief", TotalCents: 100, Count: 10, StartsAt: &past, EndsAt: &end})
	if r, err := e.svc.Grab(ctx, "brief", "u1"); err != nil || r.Outcome != grab.Granted {
		t.Fatalf("Grab within window = %+v, %v; want granted", r, err)
	}
	e.waitShardClock(t, end)
	if r, err := e.svc.Grab(ctx, "brief", "u2"); err != nil || r.Outcome != grab.Ended {
		t.Fatalf("Grab after end = %+v, %v; want ended", r, err)
	}
	// The user who holds a grant still gets it back.
	if r, err := e.svc.Grab(ctx, "brief", "u1"); err != nil || r.Outcome != grab.AlreadyGranted {
		t.Fatalf("repeat Grab after end = %+v, %v; want already_granted", r, err)
	}
}

// TestRingChangeKeepsPlacement: a pool preloaded on three shards is still
// found and grabbed after a fourth joins the ring (its placement is stored,
// never recomputed), and the same preload again is still "the same".
func TestRingChangeKeepsPlacement(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{})
	var ids []string
	for i := range 8 {
		id := fmt.Sprintf("pool%d", i)
		e.preload(t, rain.Spec{PoolID: id, TotalCents: 1000, Count: 10, SubPools: 2})
		ids = append(ids, id)
	}
	extra := redistest.Start(t, redistest.Options{})
	specs := []shard.Spec{{Name: "s0", Weight: 5, Addr: extra.Addr}} // listed first; the arbiter stays s1
	specs = append(specs, shardtest.Specs(redistest.Addrs(e.servers))...)
	set, err := shard.Open(specs, 0, shard.Options{Serial: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	svc, cat := e.service(t, set)
	for _, id := range ids {
		if r, err := svc.Grab(ctx, id, "u"); err != nil || r.Outcome != grab.Granted {
			t.Fatalf("Grab(%s) after the ring changed = %+v, %v; want granted", id, r, err)
		}
		if _, created, err := cat.Preload(ctx, rain.Spec{PoolID: id, TotalCents: 1000, Count: 10, SubPools: 2}); err != nil || created {
			t.Fatalf("Preload(%s) again after the ring changed: created %v, %v; want false, nil", id, created, err)
		}
		fresh, _ := e.service(t, set) // an instance with nothing cached
		r, err := fresh.Grab(ctx, id, "v")
		fresh.Close()
		if err != nil || r.Outcome != grab.Granted {
			t.Fatalf("Grab(%s) after preloading it again on the new ring = %+v, %v; want granted", id, r, err)
		}
		rep, err := cat.Audit(ctx, id)
		if err != nil || !rep.OK {
			t.Fatalf("Audit(%s) after the ring changed = %+v, %v", id, rep, err)
		}
	}
}

// TestServiceWatchesCPU: a Service's lanes linger by its CPU watch, which
// New starts: it finds the process short of CPU while goroutines spin, and
// not once they stop.
func TestServiceWatchesCPU(t *testing.T) {
	e := newEnv(t, 2, redistest.Options{})
	if !grab.WatchesCPU(e.svc) {
		t.Fatal("a lane does not linger by the service's CPU watch")
	}
	stop := grab.SpinCPU(t)
	waittest.Until(t, 30*time.Second, "the service finds the process short of CPU", e.svc.ShortOfCPU)
	stop()
	waittest.Until(t, 30*time.Second, "the service finds CPU to spare once the spinners stop", func() bool { return !e.svc.ShortOfCPU() })
}
