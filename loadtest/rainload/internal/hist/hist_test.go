package hist

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// exact returns the value of rank ceil(q·n) of sorted, the definition Quantile
// approximates.
func exact(sorted []time.Duration, q float64) time.Duration {
	r := int(math.Ceil(q * float64(len(sorted))))
	r = max(r, 1)
	return sorted[r-1]
}

func TestQuantileMatchesExactPercentiles(t *testing.T) {
	qs := []float64{0, 0.5, 0.9, 0.99, 0.999, 1}
	dists := []struct {
		name string
		gen  func(r *rand.Rand) time.Duration
	}{
		// Log-uniform over the histogram's whole range, 1 µs to 60 s.
		{"log-uniform 1us-60s", func(r *rand.Rand) time.Duration {
			return time.Duration(math.Exp(math.Log(1e3) + r.Float64()*(math.Log(60e9)-math.Log(1e3))))
		}},
		// A latency-like shape: most near 1 ms, a long tail.
		{"exponential 1ms", func(r *rand.Rand) time.Duration {
			return time.Duration(r.ExpFloat64() * 1e6)
		}},
		{"few small values", func(r *rand.Rand) time.Duration { return time.Duration(r.IntN(300)) }},
	}
	for _, d := range dists {
		t.Run(d.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			var h Hist
			samples := make([]time.Duration, 100_000)
			for i := range samples {
				samples[i] = d.gen(r)
				h.Record(samples[i])
			}
			slices.Sort(samples)
			if got := h.Count(); got != uint64(len(samples)) {
				t.Fatalf("Count() = %d, want %d", got, len(samples))
			}
			for _, q := range qs {
				want := exact(samples, q)
				got := h.Quantile(q)
				// 1% relative, or 1 ns for the exact buckets below 256 ns.
				if diff := math.Abs(float64(got - want)); diff > 0.01*float64(want) && diff > 1 {
					t.Errorf("Quantile(%v) = %v, want %v ±1%%", q, got, want)
				}
			}
			if got, want := h.Max(), samples[len(samples)-1]; got != want {
				t.Errorf("Max() = %v, want %v", got, want)
			}
		})
	}
}

func TestIndexAndBoundsAgree(t *testing.T) {
	prev := -1
	for _, v := range []int64{0, 1, 255, 256, 257, 383, 384, 1000, 1e6, 1e9, 60e9, 1<<36 - 1} {
		i := index(v)
		if i < prev {
			t.Errorf("index(%d) = %d, below the index of a smaller value (%d)", v, i, prev)
		}
		prev = i
		lo, hi := bounds(i)
		if v < lo || v >= hi {
			t.Errorf("index(%d) = %d with bounds [%d, %d), want v inside", v, i, lo, hi)
		}
		if lo >= 256 && float64(hi-lo)/float64(lo) > 1.0/128 {
			t.Errorf("bucket [%d, %d) wider than 1/128 of its lower bound", lo, hi)
		}
	}
	// Every bucket starts where the previous one ends.
	for i := 1; i < nBuckets; i++ {
		_, hi := bounds(i - 1)
		if lo, _ := bounds(i); lo != hi {
			t.Fatalf("bounds(%d) starts at %d, want %d (end of bucket %d)", i, lo, hi, i-1)
		}
	}
	if got := index(1 << 40); got != nBuckets-1 {
		t.Errorf("index(2^40) = %d, want the top bucket %d", got, nBuckets-1)
	}
}

func TestBeyondTopKeepsMax(t *testing.T) {
	var h Hist
	h.Record(2 * time.Minute)
	h.Record(-time.Second) // counts as 0
	if got := h.Max(); got != 2*time.Minute {
		t.Errorf("Max() = %v, want 2m", got)
	}
	if got := h.Quantile(0.5); got != 0 {
		t.Errorf("Quantile(0.5) = %v, want 0 (the negative value)", got)
	}
	if got := h.Quantile(0.99); got > 2*time.Minute || got < 68*time.Second {
		t.Errorf("Quantile(0.99) = %v, want within the top bucket, at most Max", got)
	}
}

func TestEmpty(t *testing.T) {
	var h Hist
	if h.Quantile(0.99) != 0 || h.Max() != 0 || h.Mean() != 0 || h.Count() != 0 {
		t.Errorf("empty Hist: Quantile %v Max %v Mean %v Count %d, want all 0",
			h.Quantile(0.99), h.Max(), h.Mean(), h.Count())
	}
}

func TestMergeAndReset(t *testing.T) {
	var a, b, all Hist
	for i := 1; i <= 1000; i++ {
		d := time.Duration(i) * time.Microsecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var m Hist
	m.Merge(&a)
	m.Merge(&b)
	for _, q := range []float64{0.5, 0.9, 0.99, 1} {
		if got, want := m.Quantile(q), all.Quantile(q); got != want {
			t.Errorf("merged Quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if got, want := m.Mean(), all.Mean(); got != want {
		t.Errorf("merged Mean() = %v, want %v", got, want)
	}
	m.Reset()
	if m.Count() != 0 || m.Max() != 0 || m.Quantile(0.5) != 0 {
		t.Errorf("after Reset: Count %d Max %v, want empty", m.Count(), m.Max())
	}
}

func TestConcurrentRecord(t *testing.T) {
	var h Hist
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 10_000 {
				h.Record(time.Duration(g*10_000+i) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	if got := h.Count(); got != 40_000 {
		t.Errorf("Count() = %d, want 40000", got)
	}
	if got, want := h.Max(), 39_999*time.Microsecond; got != want {
		t.Errorf("Max() = %v, want %v", got, want)
	}
}

func BenchmarkRecord(b *testing.B) {
	var h Hist
	b.RunParallel(func(pb *testing.PB) {
		d := time.Millisecond
		for pb.Next() {
			h.Record(d)
			d += 7
		}
	})
}
