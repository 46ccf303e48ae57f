package idgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.IgnoreProbe()) }

const key = "rain:idgen:test"

// newClient starts a redis-server and returns a client on it with rain
// serve's options (go-redis's retries included).
func newClient(t testing.TB, opts redistest.Options) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t, opts)
	rdb := shard.NewClient(srv.Addr, shard.Options{})
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

func newGen(t testing.TB, a Allocator, cfg Config) *Generator {
	t.Helper()
	g, err := New(a, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// take returns n IDs from g, failing the test on an error.
func take(t *testing.T, g *Generator, n int) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		id, err := g.Next(context.Background())
		if err != nil {
			t.Fatalf("Next() #%d: %v", i, err)
		}
		ids[i] = id
	}
	return ids
}

func assertIncreasing(t *testing.T, ids []int64, above int64) {
	t.Helper()
	prev := above
	for i, id := range ids {
		if id <= prev {
			t.Fatalf("Next() #%d = %d, want > %d", i, id, prev)
		}
		prev = id
	}
}

func TestUniqueAcrossGenerators(t *testing.T) {
	const gens, workers, perWorker = 4, 8, 200_000
	_, rdb := newClient(t, redistest.Options{})
	// Small steps so the generators interleave on the key many times.
	// Wait is long: 32 busy goroutines on two cores starve the loaders at
	// times, and this test is about uniqueness, not latency.
	cfg := Config{MinStep: 1000, MaxStep: 50_000, Wait: 10 * time.Second}
	all := make([][]int64, gens*workers)
	var wg sync.WaitGroup
	for gi := range gens {
		g := newGen(t, NewRedisAllocator(rdb, key), cfg)
		for w := range workers {
			wg.Go(func() {
				ids := make([]int64, 0, perWorker)
				for range perWorker {
					id, err := g.Next(context.Background())
					if err != nil {
						t.Errorf("generator %d: Next: %v", gi, err)
						return
					}
					ids = append(ids, id)
				}
				all[gi*workers+w] = ids
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	merged := make([]int64, 0, gens*workers*perWorker)
	for i, ids := range all {
		for j := 1; j < len(ids); j++ {
			if ids[j] <= ids[j-1] {
				t.Fatalf("generator %d worker %d: id #%d = %d after %d, want strictly increasing", i/workers, i%workers, j, ids[j], ids[j-1])
			}
		}
		merged = append(merged, ids...)
	}
	slices.Sort(merged)
	for i := 1; i < len(merged); i++ {
		if merged[i] == merged[i-1] {
			t.Fatalf("id %d handed out twice", merged[i])
		}
	}
	if len(merged) != gens*workers*perWorker {
		t.Fatalf("got %d ids, want %d", len(merged), gens*workers*perWorker)
	}
}

// fakeClock is a settable clock for step tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestStepAdapts(t *testing.T) {
	_, rdb := newClient(t, redistest.Options{})
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	cfg := Config{MinStep: 100, MaxStep: 1600, Target: 10 * time.Second, Now: clock.Now}
	g := newGen(t, NewRedisAllocator(rdb, key), cfg)

	// walk hands out IDs until `loads` more segments were accepted, calling
	// onLoad after each, and returns the step seen after each load.
	walk := func(loads int, onLoad func()) []int64 {
		t.Helper()
		var steps []int64
		last := g.Stats().Loads
		for len(steps) < loads {
			take(t, g, 1)
			st := g.Stats()
			if st.Loads != last {
				last = st.Loads
				steps = append(steps, st.Step)
				if st.Step < cfg.MinStep || st.Step > cfg.MaxStep {
					t.Fatalf("Step = %d, want within [%d, %d]", st.Step, cfg.MinStep, cfg.MaxStep)
				}
				onLoad()
			}
		}
		return steps
	}

	// Under load: segments last 1s of the fake clock, far below Target.
	grow := walk(8, func() { clock.Advance(time.Second) })
	if !slices.IsSorted(grow) || grow[len(grow)-1] != cfg.MaxStep {
		t.Fatalf("steps under load = %v, want non-decreasing up to %d", grow, cfg.MaxStep)
	}
	if grow[0] >= cfg.MaxStep {
		t.Fatalf("first step under load = %d, want it to start below the max", grow[0])
	}

	// Between Target and 2×Target the step holds.
	hold := walk(3, func() { clock.Advance(15 * time.Second) })
	for _, s := range hold[1:] {
		if s != cfg.MaxStep {
			t.Fatalf("steps at 1.5×Target = %v, want %d held", hold, cfg.MaxStep)
		}
	}

	// Idle: each segment lasts a minute, more than 2×Target.
	shrink := walk(8, func() { clock.Advance(time.Minute) })
	if shrink[len(shrink)-1] != cfg.MinStep {
		t.Fatalf("steps when idle = %v, want down to %d", shrink, cfg.MinStep)
	}
	for i := 1; i < len(shrink); i++ {
		if shrink[i] > shrink[i-1] {
			t.Fatalf("steps when idle = %v, want non-increasing", shrink)
		}
	}
}

func TestBackwardsGuard(t *testing.T) {
	ctx := context.Background()
	_, rdb := newClient(t, redistest.Options{})
	// Fixed step 100 so the arithmetic below is exact.
	g := newGen(t, NewRedisAllocator(rdb, key), Config{MinStep: 100, MaxStep: 100, MinBackoff: time.Millisecond})
	before := take(t, g, 250)
	assertIncreasing(t, before, 0)
	// Wait until the segment after the current one is buffered, then reset
	// the counter as a Redis that lost writes would.
	waittest.Until(t, 5*time.Second, "the next segment buffered", func() bool { return g.Stats().Next.Start != 0 })
	highest := g.Stats().Next.End
	if err := rdb.Set(ctx, key, 0, 0).Err(); err != nil {
		t.Fatal(err)
	}

	after := take(t, g, 1000)
	assertIncreasing(t, after, before[len(before)-1])
	if after[len(after)-1] <= highest {
		t.Fatalf("last id = %d, want above the highest reserved before the reset (%d)", after[len(after)-1], highest)
	}
	seen := map[int64]bool{}
	for _, id := range append(before, after...) {
		if seen[id] {
			t.Fatalf("id %d handed out twice", id)
		}
		seen[id] = true
	}
	st := g.Stats()
	if st.Refusals != 1 {
		t.Fatalf("Refusals = %d, want 1 (one segment below the guard, then catch-up)", st.Refusals)
	}
}

func TestRedisDownAndBack(t *testing.T) {
	srv, rdb := newClient(t, redistest.Options{AOF: true, Fsync: "everysec"})
	// A Next that waited for a load (Wait) instead of failing at once on a
	// generator that knows Redis is down would wait an hour: the calls
	// below carry a deadline that says so.
	cfg := Config{MinStep: 500, MaxStep: 500, Wait: time.Hour, MaxBackoff: 50 * time.Millisecond}
	g := newGen(t, NewRedisAllocator(rdb, key), cfg)
	before := take(t, g, 2200)
	assertIncreasing(t, before, 0)

	// Make the buffer state exact: the next segment loaded, no load in flight.
	waittest.Until(t, 5*time.Second, "the next segment buffered", func() bool { return g.Stats().Next.Start != 0 })
	st := g.Stats()
	buffered := st.Current.End - (st.Current.Start + st.Current.Used - 1) + (st.Next.End - st.Next.Start + 1)

	srv.Kill()

	var during []int64
	var failure error
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for failure == nil {
		id, err := g.Next(ctx)
		if err != nil {
			failure = err
			break
		}
		during = append(during, id)
	}
	if !errors.Is(failure, ErrUnavailable) || errors.Is(failure, context.DeadlineExceeded) {
		t.Fatalf("Next() with Redis down and buffers empty: %v, want ErrUnavailable once the load failed, not after a wait", failure)
	}
	if int64(len(during)) != buffered {
		t.Fatalf("served %d ids after the kill, want exactly the %d buffered", len(during), buffered)
	}
	assertIncreasing(t, during, before[len(before)-1])

	// Once the loader knows Redis is down, Next fails without waiting (a
	// wait would be Config.Wait's hour, and end with the caller's deadline).
	for i := range 20 {
		_, err := g.Next(ctx)
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next() #%d while down: %v, want ErrUnavailable at once, not after a wait", i, err)
		}
	}
	// A caller's deadline is honoured too.
	short, stop := context.WithTimeout(context.Background(), time.Millisecond)
	_, err := g.Next(short)
	stop()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Next(expired ctx) while down: %v, want ErrUnavailable", err)
	}

	srv.Restart()
	var after []int64
	deadline := time.Now().Add(10 * time.Second)
	for len(after) < 2000 {
		id, err := g.Next(ctx)
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("Next() still failing 10s after the restart: %v", err)
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		after = append(after, id)
	}
	assertIncreasing(t, after, during[len(during)-1])
	if g.Stats().LoadErrors == 0 {
		t.Fatal("LoadErrors = 0 after an outage, want > 0")
	}
}

// flaky fails every third Alloc and adds latency to the others.
type flaky struct {
	a     Allocator
	calls atomic.Int64
	delay time.Duration
}

var errInjected = errors.New("injected failure")

func (f *flaky) Alloc(ctx context.Context, n int64) (int64, error) {
	if f.calls.Add(1)%3 == 0 {
		return 0, errInjected
	}
	time.Sleep(f.delay)
	return f.a.Alloc(ctx, n)
}

func TestFlakyAllocator(t *testing.T) {
	_, rdb := newClient(t, redistest.Options{})
	f := &flaky{a: NewRedisAllocator(rdb, key), delay: time.Millisecond}
	g := newGen(t, f, Config{MinStep: 50, MaxStep: 400, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Wait: time.Second})
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var prev int64
			for range 20_000 {
				id, err := g.Next(context.Background())
				if errors.Is(err, ErrUnavailable) {
					continue // an injected failure with nothing buffered
				}
				if err != nil {
					t.Errorf("Next: %v", err)
					return
				}
				if id <= prev {
					t.Errorf("Next() = %d, want > %d", id, prev)
					return
				}
				prev = id
				mu.Lock()
				if seen[id] {
					t.Errorf("id %d handed out twice", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	st := g.Stats()
	if st.LoadErrors == 0 || st.Loads == 0 {
		t.Fatalf("Loads = %d, LoadErrors = %d; want both > 0", st.Loads, st.LoadErrors)
	}
	if len(seen) == 0 {
		t.Fatal("no ids handed out")
	}
}

func TestNextDoesNotAllocate(t *testing.T) {
	_, rdb := newClient(t, redistest.Options{})
	g := newGen(t, NewRedisAllocator(rdb, key), Config{MinStep: 1_000_000})
	take(t, g, 1) // first load
	ctx := context.Background()
	if n := testing.AllocsPerRun(10_000, func() { _, _ = g.Next(ctx) }); n != 0 {
		t.Fatalf("Next allocates %v times per call, want 0", n)
	}
}

func TestClose(t *testing.T) {
	_, rdb := newClient(t, redistest.Options{})
	g, err := New(NewRedisAllocator(rdb, key), Config{MinStep: 10, MaxStep: 10})
	if err != nil {
		t.Fatal(err)
	}
	take(t, g, 1)
	if err := g.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// What is buffered may still be served; after that, ErrClosed.
	for i := 0; ; i++ {
		_, err := g.Next(context.Background())
		if errors.Is(err, ErrClosed) {
			break
		}
		if err != nil {
			t.Fatalf("Next() after Close: %v, want ErrClosed", err)
		}
		if i > 20 {
			t.Fatal("Next() after Close kept serving past two segments of 10")
		}
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{MinStep: -1},
		{Threshold: 1},
		{Threshold: -0.5},
	} {
		if _, err := New(nil, cfg); err == nil {
			t.Errorf("New(%+v) = nil error, want one", cfg)
		}
	}
}

// TestUniqueAfterSerialShardLosesWrites: the serial shard comes back with
// an older AOF (its host lost the tail with appendfsync everysec, or an old
// backup was restored), forgetting a segment generator A is serving.
// Generator B, started afterwards, must not get that segment again: the
// watermark copies on the other shards carry the counter past it. Without
// the copies the same restore hands B A's serials (which checks the fault
// is real).
func TestUniqueAfterSerialShardLosesWrites(t *testing.T) {
	for _, mirrored := range []bool{true, false} {
		t.Run(fmt.Sprintf("mirrored=%v", mirrored), func(t *testing.T) {
			primary := redistest.Start(t, redistest.Options{AOF: true, Fsync: "always"})
			others := redistest.StartN(t, 3, redistest.Options{})
			// Two instances, each with its own connections, as rain serve wires them.
			alloc := func() Allocator {
				p := shard.NewClient(primary.Addr, shard.Options{})
				t.Cleanup(func() { p.Close() })
				var mirrors []redis.Cmdable
				if mirrored {
					for _, o := range others {
						c := shard.NewClient(o.Addr, shard.Options{})
						t.Cleanup(func() { c.Close() })
						mirrors = append(mirrors, c)
					}
				}
				return NewRedisAllocator(p, Key, mirrors...)
			}
			before := primary.SnapshotAOF() // the counter as the restore will bring it back
			a := newGen(t, alloc(), Config{})
			idsA := take(t, a, 5_000)
			a.Close() // no load of A's after the restore: B's segments are B's alone

			primary.Kill()
			primary.RestoreAOF(before)
			primary.Restart()

			b := newGen(t, alloc(), Config{})
			idsB := take(t, b, 5_000)
			seen := map[int64]bool{}
			for _, id := range idsA {
				seen[id] = true
			}
			dups := 0
			for _, id := range idsB {
				if seen[id] {
					dups++
				}
			}
			switch {
			case mirrored && dups > 0:
				t.Fatalf("%d serials handed out by both generators after the serial shard lost writes", dups)
			case !mirrored && dups == 0:
				t.Fatal("without watermark copies the restore handed out no serial twice: the fault did not land")
			}
			t.Logf("A served %d..%d, B %d..%d; %d served twice", idsA[0], idsA[len(idsA)-1], idsB[0], idsB[len(idsB)-1], dups)
		})
	}
}

// mirrorClients are clients of the watermark copies on servers, with rain
// serve's options but a long budget: a copy that answers must count even on
// a loaded machine (the tests using them are about votes, not timeouts).
func mirrorClients(t *testing.T, servers []*redistest.Server) []redis.Cmdable {
	var mirrors []redis.Cmdable
	for _, o := range servers {
		c := shard.NewClient(o.Addr, shard.Options{Timeout: 10 * time.Second})
		t.Cleanup(func() { c.Close() })
		mirrors = append(mirrors, c)
	}
	return mirrors
}

// TestWatermarkQuorum: serial loads need a majority of the watermark
// copies, for reads and writes alike; a minority down is fine.
func TestWatermarkQuorum(t *testing.T) {
	ctx := context.Background()
	_, primary := newClient(t, redistest.Options{})
	// The copies keep what they acknowledged across a restart (the quorum
	// promises nothing if a copy loses an acknowledged raise as well).
	others := redistest.StartN(t, 3, redistest.Options{AOF: true, Fsync: "always"})
	mirrors := mirrorClients(t, others)
	a := NewRedisAllocator(primary, Key, mirrors...)
	end, err := a.Alloc(ctx, 100)
	if err != nil || end != 100 {
		t.Fatalf("Alloc = %d, %v; want 100", end, err)
	}
	others[0].Kill()
	if end, err = a.Alloc(ctx, 100); err != nil || end != 200 {
		t.Fatalf("Alloc with one copy of three down = %d, %v; want 200", end, err)
	}
	others[1].Kill()
	if _, err = a.Alloc(ctx, 100); !errors.Is(err, errNoQuorum) {
		t.Fatalf("Alloc with two copies of three down = %v, want errNoQuorum", err)
	}
	// A copy that missed writes (others[0] was down for the raise to 200)
	// is outvoted: every majority holds a copy that has 200.
	others[0].Restart()
	others[1].Restart()
	if got, err := mirrors[0].Get(ctx, Key+":watermark").Int64(); err != nil || got != 100 {
		t.Fatalf("the copy that missed the raise holds %d, %v; want 100", got, err)
	}
	if err := primary.Set(ctx, Key, 0, 0).Err(); err != nil { // the primary lost everything
		t.Fatal(err)
	}
	if end, err = a.Alloc(ctx, 100); err != nil || end <= 200 {
		t.Fatalf("Alloc after the primary lost its counter = %d, %v; want above 200", end, err)
	}
}

// TestFrozenMirrorDoesNotHoldALoad: a watermark copy whose shard froze
// (SIGSTOP) is given a moment once a majority answered, not its whole
// budget: serial loads go on at the majority's pace.
func TestFrozenMirrorDoesNotHoldALoad(t *testing.T) {
	ctx := context.Background()
	_, primary := newClient(t, redistest.Options{})
	others := redistest.StartN(t, 3, redistest.Options{})
	mirrors := mirrorClients(t, others)
	a := NewRedisAllocator(primary, Key, mirrors...)
	a.MirrorTimeout = time.Hour // a load that waited for the frozen copy would not end in the test
	if _, err := a.Alloc(ctx, 100); err != nil {
		t.Fatal(err)
	}
	others[2].Pause()
	defer others[2].Resume()
	type alloc struct {
		end int64
		err error
	}
	done := make(chan alloc, 1)
	go func() {
		end, err := a.Alloc(ctx, 100)
		done <- alloc{end, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || r.end != 200 {
			t.Fatalf("Alloc with a frozen copy = %d, %v; want 200", r.end, r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Alloc with a frozen copy did not end within a minute: it waits for the copy's budget")
	}
}

// TestUniqueOnAClusterAfterAPrimaryLosesWrites: the serial shard is a
// Redis Cluster. The primary that owns the counter comes back with an older
// AOF; generator B, started afterwards, must not get the segment A is
// serving: the watermark copies on the cluster's other primaries carry the
// counter past it. Without the copies the same restore hands B A's serials
// (which checks the fault is real).
func TestUniqueOnAClusterAfterAPrimaryLosesWrites(t *testing.T) {
	for _, mirrored := range []bool{true, false} {
		t.Run(fmt.Sprintf("mirrored=%v", mirrored), func(t *testing.T) {
			ctx := context.Background()
			cl := redistest.StartCluster(t, 3, 0, redistest.Options{AOF: true, Fsync: "always"})
			gen := func() *Generator {
				specs, err := shard.ParseSpecs("c1=1@cluster/" + cl.Seeds())
				if err != nil {
					t.Fatal(err)
				}
				set, err := shard.Open(specs, 0, shard.Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { set.Close() })
				if !mirrored {
					return newGen(t, NewRedisAllocatorMirrors(set.Client("c1"), Key, nil), Config{})
				}
				g, err := ForShards(ctx, set, Config{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { g.Close() })
				return g
			}
			owner := cl.Owner(shard.Slot(Key))
			a := gen()
			take(t, a, 10) // the counter exists before the snapshot
			before := owner.SnapshotAOF()
			idsA := take(t, a, 5_000)
			a.Close()
			owner.Kill()
			owner.RestoreAOF(before)
			owner.Restart()
			cl.WaitOK()
			b := gen()
			idsB := take(t, b, 5_000)
			seen := map[int64]bool{}
			for _, id := range idsA {
				seen[id] = true
			}
			dups := 0
			for _, id := range idsB {
				if seen[id] {
					dups++
				}
			}
			switch {
			case mirrored && dups > 0:
				t.Fatalf("%d serials handed out by both generators after the counter's primary lost writes", dups)
			case !mirrored && dups == 0:
				t.Fatal("without watermark copies the restore handed out no serial twice: the fault did not land")
			}
		})
	}
}
