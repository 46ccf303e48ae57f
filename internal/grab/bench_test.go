package grab_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/alarm"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/lua"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/shard/shardtest"
	"rain/loadtest/minimal"
)

// BenchmarkGrab: grabs through the service on 4 shards with AOF and
// appendfsync always (what rain serve requires), from many goroutines, with
// allocations; beside the minimal design on the same kind of shard: one
// claim script per grab, called at once by each goroutine, on one shard with
// appendfsync everysec. Both report grabs/s.
func BenchmarkGrab(b *testing.B) {
	const packets = 5_000_000
	ctx := context.Background()
	b.Run("rain", func(b *testing.B) {
		e := newEnv(b, 4, redistest.Options{AOF: true, Fsync: "always"})
		e.preload(b, rain.Spec{PoolID: "bench", TotalCents: packets, Count: packets, HoldSeconds: 3600})
		var n atomic.Int64
		b.SetParallelism(16)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := e.svc.Grab(ctx, "bench", "u"+strconv.FormatInt(n.Add(1), 10)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grabs/s")
	})
	b.Run("one-script-per-grab-baseline", func(b *testing.B) {
		e := newEnv(b, 1, redistest.Options{AOF: true, Fsync: "everysec"})
		e.preload(b, rain.Spec{PoolID: "bench", TotalCents: packets, Count: packets, HoldSeconds: 3600})
		k := rain.SubPool{Pool: "bench", Index: 0}.Keys()
		c := e.shards.Client("s1")
		var n atomic.Int64
		b.SetParallelism(16)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := n.Add(1)
				if _, _, err := lua.ClaimMany(ctx, c, &k, 0, []lua.ClaimArg{{User: "u" + strconv.FormatInt(i, 10), Serial: i}}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grabs/s")
	})
}

// BenchmarkOpenLoop: the claim path's latency in an open loop, with no HTTP
// and no load driver in another process: the floor of issue 30's open-loop
// target on this machine. Claims are due at a fixed rate whatever the
// answers (as phones send them), each run in a goroutine of its own, and
// each claim's time is taken from when it was started to its answer. Three
// targets, each on `always` redis-servers of its own, at each rate:
//
//	rain/shards=N  Service.Grab on N shards (one lane each: one batch in
//	               flight, the linger as rain serve runs it)
//	minimal        one EVALSHA of loadtest/minimal's claim script per claim
//	               on one Redis, through a go-redis client with the
//	               baseline's default pool (what the minimal design does
//	               behind its handler)
//
// Each reports the claims' p50 and p99 in µs and the rate they were started
// at; rain also its batches' mean claims and round trip (µs), and the
// share of batches its lanes lingered before. b.N claims are sent at the
// rate: give a count, not a time.
//
//	go test -run x -bench OpenLoop -benchtime 20000x -count 3 ./internal/grab
func BenchmarkOpenLoop(b *testing.B) {
	var users atomic.Int64
	user := func() string { return "u" + strconv.FormatInt(users.Add(1), 10) }
	targets := []struct {
		name  string
		start func(b *testing.B) (claim func() error, report func())
	}{
		{"rain/shards=1", func(b *testing.B) (func() error, func()) { return rainClaims(b, 1, user) }},
		{"rain/shards=4", func(b *testing.B) (func() error, func()) { return rainClaims(b, 4, user) }},
		{"minimal", func(b *testing.B) (func() error, func()) { return minimalClaims(b, user) }},
	}
	for _, rate := range []int{2500, 5000} {
		for _, t := range targets {
			b.Run(t.name+"/rate="+strconv.Itoa(rate), func(b *testing.B) {
				if b.N > openLoopPackets {
					b.Fatalf("%d claims: more than the %d packets preloaded", b.N, openLoopPackets)
				}
				claim, report := t.start(b)
				openLoop(b, rate, claim)
				report()
			})
		}
	}
}

// openLoopPackets: the packets each target of BenchmarkOpenLoop preloads.
const openLoopPackets = 200_000

// rainClaims starts a grab service on n always shards with a pool of
// openLoopPackets, and returns one claim of a new user on it and what
// reports its batches.
func rainClaims(b *testing.B, n int, user func() string) (claim func() error, report func()) {
	servers := redistest.StartN(b, n, redistest.Options{AOF: true, Fsync: "always"})
	set := shardtest.Open(b, redistest.Addrs(servers), shard.Options{})
	var batches, claims, took atomic.Int64
	_, cat, svc := grabtest.Service(b, set, grab.Config{Form: lua.Form{Outbox: lua.OutboxBatch, BatchedDeadlines: true},
		OnBatch: func(_ string, n int, rt time.Duration, _ bool) {
			batches.Add(1)
			claims.Add(int64(n))
			took.Add(int64(rt))
		}})
	spec := rain.Spec{PoolID: "bench", TotalCents: 100 * openLoopPackets, Count: openLoopPackets, HoldSeconds: 3600}
	if _, _, err := cat.Preload(context.Background(), spec); err != nil {
		b.Fatal(err)
	}
	claim = func() error {
		r, err := svc.Grab(context.Background(), "bench", user())
		if err == nil && r.Outcome != grab.Granted {
			err = fmt.Errorf("grab answered %v, want granted", r.Outcome)
		}
		return err
	}
	report = func() {
		var lingered int64
		for _, st := range svc.ShardStats() {
			lingered += st.Lingered
		}
		if n := float64(batches.Load()); n > 0 {
			b.ReportMetric(float64(claims.Load())/n, "claims/batch")
			b.ReportMetric(float64(took.Load())/n/1e3, "batch-us")
			b.ReportMetric(float64(lingered)/n, "lingers/batch")
		}
	}
	return claim, report
}

// minimalClaims starts one always Redis with the minimal design's pool of
// openLoopPackets (loadtest/minimal), and returns one claim of a new user
// on it.
func minimalClaims(b *testing.B, user func() string) (claim func() error, report func()) {
	ctx := context.Background()
	c := redistest.Client(b, redistest.Start(b, redistest.Options{AOF: true, Fsync: "always"}))
	script := redis.NewScript(minimal.ClaimSrc)
	keys := minimal.Keys("bench")
	if err := minimal.Stock(ctx, c, keys, 1, minimal.Same(openLoopPackets, 100)); err != nil {
		b.Fatal(err)
	}
	return func() error { return script.Run(ctx, c, keys, user()).Err() }, func() {}
}

// openLoop starts b.N claims at rate a second, each due at its time
// whatever the answers, and reports their latencies. A wait of under a
// millisecond for the next claim is timed by an alarm (internal/alarm), as
// rainload times its arrivals: on Go's timer alone, in a process whose
// processors are idle, it would end up to a millisecond late, and the
// claims due meanwhile would start together.
func openLoop(b *testing.B, rate int, claim func() error) {
	every := time.Second / time.Duration(rate)
	took := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	var failed atomic.Int64
	al := alarm.New()
	if al != nil {
		defer al.Close()
	}
	b.ResetTimer()
	start := time.Now()
	for i := range took {
		due := start.Add(time.Duration(i) * every)
		for d := time.Until(due); d > 0; d = time.Until(due) {
			if al == nil || d >= time.Millisecond {
				time.Sleep(d)
				continue
			}
			al.Set(d)
			<-al.C() // every ring is taken: none is left for the next wait
		}
		wg.Add(1)
		go func(t0 time.Time) {
			defer wg.Done()
			if err := claim(); err != nil && failed.Add(1) == 1 {
				b.Error(err)
			}
			took[i] = time.Since(t0)
		}(time.Now())
	}
	sent := time.Since(start)
	wg.Wait()
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-us")
	b.ReportMetric(float64(b.N)/sent.Seconds(), "sent/s")
}
