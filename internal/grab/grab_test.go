package grab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rain/internal/idgen"
	"rain/internal/redistest"
	"rain/internal/shard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is a Service on real redis-server shards.
type env struct {
	servers []*redistest.Server
	shards  *shard.Set
	svc     *Service
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
	specs := make([]shard.Spec, len(addrs))
	for i, a := range addrs {
		specs[i] = shard.Spec{Name: fmt.Sprintf("s%d", i+1), Weight: 1, Addr: a}
	}
	// The options of rain serve, go-redis's retries included.
	set, err := shard.Open(specs, 0, shard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	e := &env{servers: servers, shards: set}
	e.svc = e.service(t)
	return e
}

// service is one rain instance on env's shards, as rain serve wires it: its
// own serial generator on s1 with watermark copies on the others, and s1 as
// the arbiter of pool records.
func (e *env) service(t testing.TB) *Service {
	t.Helper()
	gen, err := idgen.New(idgen.NewRedisAllocator(e.shards.Client("s1"), idgen.Key, e.shards.Except("s1")...), idgen.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gen.Close() })
	svc := New(e.shards, Config{Serials: gen, Arbiter: "s1"})
	t.Cleanup(svc.Close)
	return svc
}

func (e *env) preload(t testing.TB, spec Spec) *Status {
	t.Helper()
	st, created, err := e.svc.Preload(context.Background(), spec)
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
	r, err := e.svc.Audit(context.Background(), pool)
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
	st := e.preload(t, Spec{PoolID: "p1", TotalCents: 1000, Count: 10})
	if st.RemainingCount != 10 || st.RemainingCents != 1000 || st.State != stateOpen || len(st.SubPools) != 1 {
		t.Fatalf("Status after preload = %+v, want 10 packets, 1000 cents, open, 1 sub-pool", st)
	}

	var sum int64
	first := map[string]Result{}
	for i := range 10 {
		user := fmt.Sprintf("u%d", i)
		r, err := e.svc.Grab(ctx, "p1", user)
		if err != nil || r.Outcome != Granted {
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
		if err != nil || r.Outcome != AlreadyGranted || r.Amount != want.Amount || r.Serial != want.Serial || !r.ExpiresAt.Equal(want.ExpiresAt) {
			t.Fatalf("repeat Grab(p1, %s) = %+v, %v; want already_granted with %+v", user, r, err, want)
		}
	}
	if r, err := e.svc.Grab(ctx, "p1", "late"); err != nil || r.Outcome != SoldOut {
		t.Fatalf("Grab after sell-out = %+v, %v; want sold_out", r, err)
	}
	if r, err := e.svc.Grab(ctx, "nope", "u1"); err != nil || r.Outcome != NotFound {
		t.Fatalf("Grab(unknown pool) = %+v, %v; want not_found", r, err)
	}
	st, err := e.svc.Status(ctx, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if st.RemainingCount != 0 || st.HeldCount != 10 || st.HeldCents != 1000 {
		t.Fatalf("Status after sell-out = %+v, want 0 left, 10 held, 1000 cents held", st)
	}
	e.assertAudit(t, "p1")
}

func TestPreloadIdempotent(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 2, redistest.Options{})
	spec := Spec{PoolID: "p", TotalCents: 5000, Count: 100, MaxCents: 200}
	e.preload(t, spec)
	if _, created, err := e.svc.Preload(ctx, spec); err != nil || created {
		t.Fatalf("Preload(same spec) created = %v, err = %v; want false, nil", created, err)
	}
	// Defaults filled in count as the same spec.
	same := spec
	same.MinCents, same.HoldSeconds = 1, DefaultHoldSeconds
	if _, created, err := e.svc.Preload(ctx, same); err != nil || created {
		t.Fatalf("Preload(same spec, defaults spelled out) created = %v, err = %v; want false, nil", created, err)
	}
	other := spec
	other.Count = 99
	if _, _, err := e.svc.Preload(ctx, other); !errors.Is(err, ErrConflict) {
		t.Fatalf("Preload(other spec, same id) err = %v, want ErrConflict", err)
	}
	st, err := e.svc.Status(ctx, "p")
	if err != nil || st.Count != 100 || st.RemainingCount != 100 {
		t.Fatalf("Status after a refused preload = %+v, %v; want the first spec untouched", st, err)
	}
}

func TestPreloadInvalid(t *testing.T) {
	e := newEnv(t, 1, redistest.Options{})
	past := time.Now().Add(-time.Hour)
	for _, spec := range []Spec{
		{PoolID: "", TotalCents: 10, Count: 1},
		{PoolID: "bad id", TotalCents: 10, Count: 1},
		{PoolID: "p{x}", TotalCents: 10, Count: 1},
		{PoolID: "p", TotalCents: 10, Count: 0},
		{PoolID: "p", TotalCents: 5, Count: 10},
		{PoolID: "p", TotalCents: 100, Count: 10, MinCents: 20},
		{PoolID: "p", TotalCents: 100, Count: 10, MaxCents: 5},
		{PoolID: "p", TotalCents: MaxTotalCents + 1, Count: 10},
		{PoolID: "p", TotalCents: 100, Count: 10, SubPools: -1},
		{PoolID: "p", TotalCents: 100, Count: 10, SubPools: 11},
		{PoolID: "p", TotalCents: 100, Count: 10, HoldSeconds: -5},
		{PoolID: "p", TotalCents: 100, Count: 10, StartsAt: &past, EndsAt: &past},
	} {
		_, _, err := e.svc.Preload(context.Background(), spec)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("Preload(%+v) err = %v, want ErrInvalid", spec, err)
		}
	}
	// Nothing was written (the serial counter aside).
	keys, err := e.shards.Client("s1").Keys(context.Background(), "*").Result()
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == idgen.Key })
	if err != nil || len(keys) != 0 {
		t.Fatalf("keys after invalid preloads = %v, %v; want none but rain:serial", keys, err)
	}
}

func TestPreloadResumesAfterCrash(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 3, redistest.Options{})
	spec := Spec{PoolID: "big", TotalCents: 10_000_000, Count: 100_000, SubPools: 3}
	crash := errors.New("crash")
	var mu sync.Mutex
	trips := 0
	e.svc.afterTrip = func(j int, next int64) error {
		mu.Lock()
		defer mu.Unlock()
		if trips++; j == 1 && next >= 1 {
			return crash // sub-pool 1 dies after its first round trip
		}
		return nil
	}
	if _, _, err := e.svc.Preload(ctx, spec); !errors.Is(err, crash) {
		t.Fatalf("Preload with a crash = %v, want the crash", err)
	}
	// A half-loaded pool grants nothing.
	if r, err := e.svc.Grab(ctx, "big", "early"); err != nil || r.Outcome != NotStarted {
		t.Fatalf("Grab(half-loaded pool) = %+v, %v; want not_started", r, err)
	}
	st, err := e.svc.Status(ctx, "big")
	if err != nil || st.State != stateLoading || st.RemainingCount >= spec.Count {
		t.Fatalf("Status(half-loaded) = %+v, %v; want loading with partial stock", st, err)
	}

	e.svc.afterTrip = nil
	st, created, err := e.svc.Preload(ctx, spec)
	if err != nil || !created {
		t.Fatalf("Preload again = created %v, %v; want it to finish the job", created, err)
	}
	if st.RemainingCount != spec.Count || st.RemainingCents != spec.TotalCents || st.State != stateOpen {
		t.Fatalf("Status after resume = %+v, want all %d packets, %d cents, open", st, spec.Count, spec.TotalCents)
	}
	e.assertAudit(t, "big")
	if r, err := e.svc.Grab(ctx, "big", "now"); err != nil || r.Outcome != Granted {
		t.Fatalf("Grab after resume = %+v, %v; want granted", r, err)
	}
}

func TestPlacement(t *testing.T) {
	e := newEnv(t, 3, redistest.Options{})
	for _, tc := range []struct {
		k    int
		want int // distinct shards
	}{{1, 1}, {3, 3}, {5, 3}} {
		id := fmt.Sprintf("pl%d", tc.k)
		st := e.preload(t, Spec{PoolID: id, TotalCents: 1000, Count: 100, SubPools: tc.k})
		shards := map[string]int{}
		for _, sp := range st.SubPools {
			shards[sp.Shard]++
		}
		if len(st.SubPools) != tc.k || len(shards) != tc.want {
			t.Fatalf("sub_pools %d: placement %+v, want %d sub-pools on %d distinct shards", tc.k, st.SubPools, tc.k, tc.want)
		}
		e.assertAudit(t, id)
	}
}

func TestScriptCacheFlushed(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 1, redistest.Options{})
	e.preload(t, Spec{PoolID: "p", TotalCents: 100, Count: 10})
	if err := e.shards.Client("s1").ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := e.svc.Grab(ctx, "p", "u"); err != nil || r.Outcome != Granted {
		t.Fatalf("Grab after SCRIPT FLUSH = %+v, %v; want granted (EVAL fallback)", r, err)
	}
}

func TestWindow(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, 1, redistest.Options{})
	soon := time.Now().Add(time.Hour)
	e.preload(t, Spec{PoolID: "later", TotalCents: 100, Count: 10, StartsAt: &soon})
	r, err := e.svc.Grab(ctx, "later", "u")
	if err != nil || r.Outcome != NotStarted || r.RetryAfter < 59*time.Minute || r.RetryAfter > time.Hour {
		t.Fatalf("Grab before start = %+v, %v; want not_started, retry in ~1h", r, err)
	}
	past, end := time.Now().Add(-time.Hour), time.Now().Add(300*time.Millisecond)
	e.preload(t, Spec{PoolID: "brief", TotalCents: 100, Count: 10, StartsAt: &past, EndsAt: &end})
	if r, err := e.svc.Grab(ctx, "brief", "u1"); err != nil || r.Outcome != Granted {
		t.Fatalf("Grab within window = %+v, %v; want granted", r, err)
	}
	time.Sleep(time.Until(end) + 50*time.Millisecond)
	if r, err := e.svc.Grab(ctx, "brief", "u2"); err != nil || r.Outcome != Ended {
		t.Fatalf("Grab after end = %+v, %v; want ended", r, err)
	}
	// The user who holds a grant still gets it back.
	if r, err := e.svc.Grab(ctx, "brief", "u1"); err != nil || r.Outcome != AlreadyGranted {
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
		e.preload(t, Spec{PoolID: id, TotalCents: 1000, Count: 10, SubPools: 2})
		ids = append(ids, id)
	}
	extra := redistest.Start(t, redistest.Options{})
	specs := []shard.Spec{{Name: "s0", Weight: 5, Addr: extra.Addr}} // sorts first; the arbiter stays s1
	for i, s := range e.servers {
		specs = append(specs, shard.Spec{Name: fmt.Sprintf("s%d", i+1), Weight: 1, Addr: s.Addr})
	}
	set, err := shard.Open(specs, 0, shard.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	svc := New(set, Config{Serials: e.svc.serials, Arbiter: "s1"})
	t.Cleanup(svc.Close)
	for _, id := range ids {
		if r, err := svc.Grab(ctx, id, "u"); err != nil || r.Outcome != Granted {
			t.Fatalf("Grab(%s) after the ring changed = %+v, %v; want granted", id, r, err)
		}
		if _, created, err := svc.Preload(ctx, Spec{PoolID: id, TotalCents: 1000, Count: 10, SubPools: 2}); err != nil || created {
			t.Fatalf("Preload(%s) again after the ring changed: created %v, %v; want false, nil", id, created, err)
		}
		fresh := New(set, Config{Serials: e.svc.serials, Arbiter: "s1"}) // an instance with nothing cached
		r, err := fresh.Grab(ctx, id, "v")
		fresh.Close()
		if err != nil || r.Outcome != Granted {
			t.Fatalf("Grab(%s) after preloading it again on the new ring = %+v, %v; want granted", id, r, err)
		}
		rep, err := svc.Audit(ctx, id)
		if err != nil || !rep.OK {
			t.Fatalf("Audit(%s) after the ring changed = %+v, %v", id, rep, err)
		}
	}
}

func TestAutoSubPools(t *testing.T) {
	for _, tc := range []struct {
		count  int64
		shards int
		want   int
	}{
		{1, 4, 1}, {100_000, 4, 1}, {100_001, 4, 2}, {350_000, 4, 4}, {1_000_000, 4, 4}, {1_000_000, 16, 10}, {5, 1, 1},
	} {
		if got := autoSubPools(tc.count, tc.shards); got != tc.want {
			t.Errorf("autoSubPools(%d, %d) = %d, want %d", tc.count, tc.shards, got, tc.want)
		}
	}
}
