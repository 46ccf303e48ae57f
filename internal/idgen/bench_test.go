package idgen

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"rain/internal/redistest"
)

// BenchmarkNext is the hot path: IDs from buffered segments, Redis behind.
// Compare with BenchmarkIncr, one Redis round trip per ID.
func BenchmarkNext(b *testing.B) {
	_, rdb := newClient(b, redistest.Options{})
	g := newGen(b, NewRedisAllocator(rdb, key), Config{})
	warm(b, g)
	ctx := context.Background()
	st0 := g.Stats()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := g.Next(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportStalls(b, st0, g.Stats())
}

// BenchmarkIncr is the baseline: one INCR per ID.
func BenchmarkIncr(b *testing.B) {
	_, rdb := newClient(b, redistest.Options{})
	ctx := context.Background()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := rdb.Incr(ctx, key).Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// slow adds a fixed latency to every Alloc, like a remote or loaded Redis.
type slow struct {
	a     Allocator
	delay time.Duration
}

func (s slow) Alloc(ctx context.Context, n int64) (int64, error) {
	time.Sleep(s.delay)
	return s.a.Alloc(ctx, n)
}

// BenchmarkNextSlowAllocator: 2 ms per Alloc and the default threshold.
// It reports stalls per million IDs in steady state (target 0) and the
// latency of the calls that overlapped a segment switch (target p99.9 < 10µs).
//
//   - serial: one caller, so the loader has a core of its own: the cost of
//     the switch itself.
//   - parallel: a caller per core spinning on Next. The loader must wait for
//     the Go scheduler to preempt a caller (up to 10 ms), and a caller that
//     is preempted mid-call shows that pause in its latency: this measures
//     the scheduler as much as the generator, and is reported for honesty.
//
// "default" keeps the default step bounds (few switches a run, as the step
// grows to MaxStep); "maxstep=256k" caps the step so a serial run crosses
// a hundred switches. (256k run in parallel is undersized: a segment lasts
// ~13 ms, and a loader that must wait for preemption three times per load
// misses it; size MaxStep for the peak rate.)
func BenchmarkNextSlowAllocator(b *testing.B) {
	for _, bc := range []struct {
		name     string
		cfg      Config
		parallel bool
	}{
		{"default/serial", Config{}, false},
		{"default/parallel", Config{}, true},
		{"maxstep=256k/serial", Config{MaxStep: 256 << 10}, false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			_, rdb := newClient(b, redistest.Options{})
			g := newGen(b, slow{NewRedisAllocator(rdb, key), 2 * time.Millisecond}, bc.cfg)
			warm(b, g)
			var mu sync.Mutex
			var switching []time.Duration // latency of calls during which a switch happened
			worker := func(next func() bool) {
				ctx := context.Background()
				var local []time.Duration
				for next() {
					sw := g.switches.Load()
					t0 := time.Now()
					if _, err := g.Next(ctx); err != nil {
						b.Error(err)
						return
					}
					d := time.Since(t0)
					if g.switches.Load() != sw {
						local = append(local, d)
					}
				}
				mu.Lock()
				switching = append(switching, local...)
				mu.Unlock()
			}
			st0 := g.Stats()
			b.ResetTimer()
			if bc.parallel {
				b.RunParallel(func(pb *testing.PB) { worker(pb.Next) })
			} else {
				worker(b.Loop)
			}
			b.StopTimer()
			reportStalls(b, st0, g.Stats())
			reportLatencies(b, "switch", switching)
		})
	}
}

func reportLatencies(b *testing.B, name string, ds []time.Duration) {
	b.Helper()
	b.ReportMetric(float64(len(ds)), name+"-calls")
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(q float64) float64 { return float64(ds[min(len(ds)-1, int(float64(len(ds))*q))].Nanoseconds()) }
	b.ReportMetric(at(0.5), name+"-p50-ns")
	b.ReportMetric(at(0.999), name+"-p99.9-ns")
	b.ReportMetric(float64(ds[len(ds)-1].Nanoseconds()), name+"-max-ns")
}

// warm hands out IDs until the step has stopped growing and a segment of the
// final size is current: the steady state the benchmarks measure.
func warm(b *testing.B, g *Generator) {
	b.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for range 1 << 16 {
			if _, err := g.Next(ctx); err != nil {
				b.Fatal(err)
			}
		}
		st := g.Stats()
		if st.Step == g.cfg.MaxStep && st.Current.End-st.Current.Start+1 == g.cfg.MaxStep {
			return
		}
	}
	b.Fatal("step did not reach MaxStep within 20s of warm-up")
}

func reportStalls(b *testing.B, before, after Stats) {
	b.Helper()
	ids := float64(b.N)
	b.ReportMetric(float64(after.Stalls-before.Stalls)/ids*1e6, "stalls/Mid")
}
