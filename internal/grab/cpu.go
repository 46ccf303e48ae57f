package grab

import (
	"math"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

// The lanes' linger depends on whether this process is short of CPU (see
// batcher.lingerFor). A process is short of CPU when its goroutines wait to
// run: the mean of the Go scheduler's latencies (the time from runnable to
// running, /sched/latencies:seconds, which the runtime times for one
// transition in eight) over each cpuPeriod. With CPU to spare it is a few
// tens of µs; once the cores are all taken (a closed loop of clients that
// send again as soon as they are answered, or a flood) it is longer. The
// verdict turns after cpuShortPeriods periods in a row above cpuShortAbove,
// so that one pause (a GC cycle, a sale's first burst) does not turn it,
// and turns back after one period below cpuEnoughBelow.
//
// Measured on a 2-core machine with the load driver, rain and 4 always
// shards on it (docs/benchmarks.md, "A linger for a process short of
// CPU"): an open loop at half the saturated rate averaged 18 to 44 µs per
// 50 ms in a quiet stretch of the machine, the saturated closed loop of 64
// connections 62 to 127 µs.
const (
	cpuPeriod = 50 * time.Millisecond
	// cpuShortAbove: cpuShortPeriods periods in a row with a mean wait
	// above this make the process short of CPU; cpuEnoughBelow: one below
	// this, no longer.
	cpuShortAbove   = 60 * time.Microsecond
	cpuShortPeriods = 2
	cpuEnoughBelow  = 50 * time.Microsecond
	// cpuMinWaits: a period with fewer waits timed than this (about 400
	// wake-ups in 50 ms, 8,000 a second) is an idle process, whatever its
	// few waits were.
	cpuMinWaits = 50
)

// cpuWatch tells whether the process is short of CPU, from the runtime's
// scheduler latencies, read every cpuPeriod by run.
type cpuWatch struct {
	short  atomic.Bool
	sample []metrics.Sample
	prev   []uint64 // the histogram's counts at the last read
	above  int      // periods in a row with a mean wait above cpuShortAbove
}

func newCPUWatch() *cpuWatch {
	return &cpuWatch{sample: []metrics.Sample{{Name: "/sched/latencies:seconds"}}}
}

// run reads the scheduler's latencies every cpuPeriod until stop is closed.
func (w *cpuWatch) run(stop <-chan struct{}) {
	t := time.NewTicker(cpuPeriod)
	defer t.Stop()
	w.read()
	for {
		select {
		case <-t.C:
			w.read()
		case <-stop:
			return
		}
	}
}

// read updates the verdict from the latencies since the last read.
func (w *cpuWatch) read() {
	metrics.Read(w.sample)
	if w.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return // a runtime without the metric: never short
	}
	h := w.sample[0].Value.Float64Histogram()
	mean, n := meanWait(h.Buckets, h.Counts, w.prev)
	w.prev = append(w.prev[:0], h.Counts...)
	short, above := shortOfCPU(w.short.Load(), w.above, mean, n)
	w.short.Store(short)
	w.above = above
}

// meanWait is the mean of the waits counted since prev (the counts of an
// earlier read of the same histogram; nil: since the start), each taken at
// its bucket's middle (an unbounded bucket at its finite bound), and how
// many there were.
func meanWait(buckets []float64, counts, prev []uint64) (time.Duration, uint64) {
	var n uint64
	var sum float64
	for i, c := range counts {
		if i < len(prev) {
			c -= prev[i]
		}
		if c == 0 {
			continue
		}
		lo, hi := buckets[i], buckets[i+1]
		if math.IsInf(lo, -1) || lo < 0 {
			lo = 0
		}
		if math.IsInf(hi, 1) {
			hi = lo
		}
		n += c
		sum += float64(c) * (lo + hi) / 2
	}
	if n == 0 {
		return 0, 0
	}
	return time.Duration(sum / float64(n) * float64(time.Second)), n
}

// shortOfCPU is the verdict after a period whose n waits averaged mean,
// given the verdict before it (was) and how many periods in a row before
// it were above cpuShortAbove; it returns that count with this period.
func shortOfCPU(was bool, above int, mean time.Duration, n uint64) (bool, int) {
	switch {
	case n < cpuMinWaits:
		return false, 0
	case mean > cpuShortAbove:
		above++
		return was || above >= cpuShortPeriods, above
	case mean < cpuEnoughBelow:
		return false, 0
	}
	return was, 0
}
