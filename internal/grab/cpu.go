package grab

import (
	"math"
	"math/bits"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// The lanes linger only while this process is short of CPU (see
// batcher.shortOfCPU). A process is short of CPU when its goroutines wait to
// run: the mean of the Go scheduler's latencies (the time from runnable to
// running, /sched/latencies:seconds, which the runtime times for one
// transition in eight) over each cpuPeriod. With CPU to spare it is a few
// tens of µs; once the cores are all taken (a closed loop of clients that
// send again as soon as they are answered, or a flood) it is longer. One
// period's mean swings widely, so the verdict goes by the last cpuWindow
// periods: it turns once cpuShortIn of them were busy (a mean above
// cpuBusyAbove), and turns back once no more than cpuEnoughIn were. An idle
// period is not busy.
//
// Measured on a 2-core machine with the load driver, rain and 4 always
// shards on it (docs/benchmarks.md, "A linger for a process short of
// CPU"), the means of 50 ms periods: an open loop at half the saturated
// rate, median 29 µs, a quarter of the periods above 55 µs; the saturated
// closed loop of 64 connections on 4 shards, median 64 µs, nine periods in
// ten at 50 µs or more; on 1 shard, median 94 µs.
const (
	cpuPeriod    = 50 * time.Millisecond
	cpuBusyAbove = 50 * time.Microsecond
	cpuWindow    = 8 // periods, 400 ms
	cpuShortIn   = 6 // busy periods of the window that make it short
	cpuEnoughIn  = 3 // busy periods of the window at most that end it
	// cpuMinWaits: a period with fewer waits timed than this (about 400
	// wake-ups in 50 ms, 8,000 a second) is an idle process, whatever its
	// few waits were.
	cpuMinWaits = 50
)

// The window is the bits of a uint8, and cpuEnoughIn < cpuShortIn <= cpuWindow.
const _ = uint(8-cpuWindow) + uint(cpuWindow-8) + uint(cpuWindow-cpuShortIn) + uint(cpuShortIn-cpuEnoughIn-1)

// cpuWatch tells whether the process is short of CPU, from the runtime's
// scheduler latencies, read every cpuPeriod by run.
type cpuWatch struct {
	short atomic.Bool
	// mu orders read's verdicts and hold's, and guards held: the verdict
	// is set by hold, and read leaves it (tests).
	mu     sync.Mutex
	held   bool
	sample []metrics.Sample
	prev   []uint64 // the histogram's counts at the last read
	busy   uint8    // the last cpuWindow periods, newest in bit 0: 1 if busy
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
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.held {
		return
	}
	short, busy := shortOfCPU(w.short.Load(), w.busy, mean, n)
	w.short.Store(short)
	w.busy = busy
}

// hold sets the verdict for good: read no longer changes it (tests).
func (w *cpuWatch) hold(short bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held = true
	w.short.Store(short)
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
		if lo < 0 { // -Inf: the first bucket
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
// given the verdict before it (was) and the periods before it (busy, as in
// cpuWatch); it returns the periods with this one.
func shortOfCPU(was bool, busy uint8, mean time.Duration, n uint64) (bool, uint8) {
	busy <<= 1 // cpuWindow is 8: the oldest period falls out
	if n >= cpuMinWaits && mean > cpuBusyAbove {
		busy |= 1
	}
	switch k := bits.OnesCount8(busy); {
	case k >= cpuShortIn:
		return true, busy
	case k <= cpuEnoughIn:
		return false, busy
	}
	return was, busy
}
