package grab

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rain/internal/wait/waittest"
)

// TestMeanWait: the mean of a histogram's new counts, each at its bucket's
// middle, unbounded buckets at their finite bound.
func TestMeanWait(t *testing.T) {
	buckets := []float64{math.Inf(-1), 0, 10e-6, 100e-6, 1e-3, math.Inf(1)}
	for _, c := range []struct {
		name         string
		counts, prev []uint64
		mean         time.Duration
		n            uint64
	}{
		{"nothing", []uint64{0, 0, 0, 0, 0}, nil, 0, 0},
		{"one bucket", []uint64{0, 4, 0, 0, 0}, nil, 5 * time.Microsecond, 4},
		{"two buckets", []uint64{0, 1, 1, 0, 0}, nil, 30 * time.Microsecond, 2},
		{"since an earlier read", []uint64{0, 9, 3, 0, 0}, []uint64{0, 9, 2, 0, 0}, 55 * time.Microsecond, 1},
		{"the unbounded ends", []uint64{2, 0, 0, 0, 2}, nil, 500 * time.Microsecond, 4},
		{"an earlier read of fewer buckets", []uint64{0, 1, 1, 0, 0}, []uint64{0, 1}, 55 * time.Microsecond, 1},
		{"the overflow bucket since an earlier read", []uint64{0, 5, 0, 0, 7}, []uint64{0, 5, 0, 0, 6}, time.Millisecond, 1},
	} {
		mean, n := meanWait(buckets, c.counts, c.prev)
		if n != c.n || (mean-c.mean).Abs() > time.Nanosecond {
			t.Errorf("%s: meanWait = %v over %d, want %v over %d", c.name, mean, n, c.mean, c.n)
		}
	}
}

// TestShortOfCPU: the verdict turns once cpuShortIn of the last cpuWindow
// periods were busy, turns back once no more than cpuEnoughIn were, holds
// between them; an idle period is not busy, whatever its mean.
func TestShortOfCPU(t *testing.T) {
	high, low := cpuBusyAbove+time.Microsecond, cpuBusyAbove
	ones := func(k int) uint8 { return uint8(1<<k - 1) } // the k newest periods busy
	for _, c := range []struct {
		name     string
		was      bool
		busy     uint8
		mean     time.Duration
		n        uint64
		want     bool
		wantBusy uint8
	}{
		{"one busy period", false, 0, high, cpuMinWaits, false, 1},
		{"the one that makes cpuShortIn", false, ones(cpuShortIn - 1), high, cpuMinWaits, true, ones(cpuShortIn)},
		{"a quiet one after cpuShortIn-1", false, ones(cpuShortIn - 1), low, cpuMinWaits, false, ones(cpuShortIn-1) << 1},
		{"short, a quiet period", true, ones(cpuWindow), low, cpuMinWaits, true, ones(cpuWindow) << 1},
		{"short, the busy ones fall to cpuEnoughIn", true, 0x80 | ones(cpuEnoughIn), low, cpuMinWaits, false, ones(cpuEnoughIn) << 1},
		{"short, still more than cpuEnoughIn", true, ones(cpuEnoughIn + 1), low, cpuMinWaits, true, ones(cpuEnoughIn+1) << 1},
		{"the oldest falls out of the window", false, 0x80 | ones(cpuShortIn-2), high, cpuMinWaits, false, ones(cpuShortIn-2)<<1 | 1},
		{"an idle period is not busy", false, ones(cpuShortIn - 1), time.Millisecond, cpuMinWaits - 1, false, ones(cpuShortIn-1) << 1},
	} {
		got, busy := shortOfCPU(c.was, c.busy, c.mean, c.n)
		if got != c.want || busy != c.wantBusy {
			t.Errorf("%s: shortOfCPU(%v, %08b, %v, %d) = %v, %08b; want %v, %08b", c.name, c.was, c.busy, c.mean, c.n, got, busy, c.want, c.wantBusy)
		}
	}
}

// TestCPUWatch: the watch finds the process short of CPU while more
// goroutines spin than there are cores for them, and no longer once they
// stop.
func TestCPUWatch(t *testing.T) {
	w := newCPUWatch()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { w.run(stop) })
	defer func() { close(stop); wg.Wait() }()

	done := spinCPU(t)
	waittest.Until(t, 30*time.Second, "the watch finds the process short of CPU", w.short.Load)
	done()
	waittest.Until(t, 30*time.Second, "the watch finds CPU to spare once the spinners stop", func() bool { return !w.short.Load() })
}

// spinCPU starts sixteen goroutines to a core that take turns: each spins
// about 25 µs, then goes to the back of the run queue, so that each waits
// for the others (about 375 µs). Short spins make many waits, so
// that enough are timed (the runtime times one in eight) even when the
// process gets a fifth of its cores. It returns a func that stops them and
// waits for them; the test's end stops them too.
func spinCPU(tb testing.TB) (stop func()) {
	var spin atomic.Bool
	spin.Store(true)
	var spinners sync.WaitGroup
	for range 16 * runtime.GOMAXPROCS(0) {
		spinners.Go(func() {
			for spin.Load() {
				for start := time.Now(); time.Since(start) < 25*time.Microsecond; {
				}
				runtime.Gosched()
			}
		})
	}
	stop = func() { spin.Store(false); spinners.Wait() }
	tb.Cleanup(stop)
	return stop
}

// TestLinger: a lane's linger lasts lingerShortOfCPU, and a claim that
// comes meanwhile joins the batch. Timers never fire early, so the lower
// bounds hold on any machine (upper ones would not: a busy machine may run
// the lane late); the claim's arrival is tried a few times.
func TestLinger(t *testing.T) {
	b := &batcher{reqs: make(chan *claimReq, 4), stop: make(chan struct{})}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	linger := func(arrive time.Duration) (int, time.Duration) {
		if arrive > 0 {
			go func() {
				time.Sleep(arrive)
				b.reqs <- &claimReq{}
			}()
		}
		start := time.Now()
		n := len(b.linger([]*claimReq{{}}, 2, timer))
		took := time.Since(start)
		if arrive > 0 && n == 1 {
			<-b.reqs // it came too late: take it out before the next try
		}
		return n, took
	}
	if _, took := linger(0); took < lingerShortOfCPU {
		t.Fatalf("a linger lasted %v, want at least %v", took, lingerShortOfCPU)
	}
	const arrive = time.Millisecond
	tries(t, "a claim that comes a millisecond into a linger joins the batch", func() bool {
		n, took := linger(arrive)
		return n == 2 && took >= arrive
	})
}

// tries runs f up to 20 times, until it reports true; it fails t with what
// when it never does.
func tries(t *testing.T, what string, f func() bool) {
	t.Helper()
	for range 20 {
		if f() {
			return
		}
	}
	t.Fatalf("not once in 20 tries: %s", what)
}
