package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"rain/internal/wait/waittest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// IgnoreCurrent: ants starts a default pool of its own at init.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreCurrent()) }

func newPool(t *testing.T, cfg Config) *Pool {
	t.Helper()
	if cfg.Interval == 0 {
		cfg.Interval = time.Hour // tests drive step by hand unless they say so
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(5 * time.Second); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

// TestControllerFollowsLoad drives the controller with made-up samples, as a
// fake clock would: 500 ms intervals, 2 ms per task.
func TestControllerFollowsLoad(t *testing.T) {
	cfg := Config{Min: 8, Max: 1024}
	if err := cfg.init(); err != nil {
		t.Fatal(err)
	}
	c := controller{cfg: &cfg}
	const dt = 500 * time.Millisecond
	var s sample
	capNow := cfg.Min
	// tick feeds one interval at rate arrivals/s, each task taking svc.
	tick := func(rate float64, svc time.Duration) (int, int) {
		n := int64(rate * dt.Seconds())
		s.arrivals += n
		s.completed += n
		s.busyNanos += n * int64(svc)
		next, target := c.decide(dt, capNow, s)
		if next < cfg.Min || next > cfg.Max {
			t.Fatalf("capacity %d outside [%d, %d]", next, cfg.Min, cfg.Max)
		}
		if next > capNow && float64(next) > float64(capNow)*cfg.MaxGrowth+1 ||
			next < capNow && float64(next) < float64(capNow)*cfg.MaxShrink-1 {
			t.Fatalf("step %d -> %d exceeds the bounds ×%v / ×%v", capNow, next, cfg.MaxGrowth, cfg.MaxShrink)
		}
		capNow = next
		return next, target
	}
	tick(0, 0) // primes

	// 50,000 grabs/s × 2 ms × headroom 2 = 200 workers: reached within a few ticks.
	var ticks int
	for ticks = 1; ticks <= 10; ticks++ {
		if next, _ := tick(50_000, 2*time.Millisecond); next == 200 {
			break
		}
	}
	if ticks > 6 {
		t.Fatalf("capacity %d after %d ticks at 50k/s, want 200 within 6", capNow, ticks)
	}
	// Steady load: no flapping.
	for range 10 {
		if next, _ := tick(50_000*(1+0.05*(rand.Float64()-0.5)), 2*time.Millisecond); next != 200 {
			t.Fatalf("capacity moved to %d under a steady load ±2.5%%, want it held at 200", next)
		}
	}
	// A flood: target clamps at Max.
	for range 10 {
		tick(10_000_000, 2*time.Millisecond)
	}
	if capNow != cfg.Max {
		t.Fatalf("capacity under a flood = %d, want Max %d", capNow, cfg.Max)
	}
	// Load gone: back down to Min.
	for range 30 {
		tick(0, 0)
	}
	if capNow != cfg.Min {
		t.Fatalf("capacity when idle = %d, want Min %d", capNow, cfg.Min)
	}
}

func TestSaturationSheds(t *testing.T) {
	const workers, queue, callers = 4, 8, 100
	p := newPool(t, Config{Min: workers, Max: workers, Queue: queue})
	release := make(chan struct{})
	var ran atomic.Int64
	results := make(chan error, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			err := p.Do(context.Background(), func(context.Context) {
				ran.Add(1)
				<-release
			})
			results <- err
		})
	}
	// Wait until the pool is full and everyone else has been refused:
	// shedding does not wait for a worker (none is free until release).
	waittest.Until(t, 5*time.Second, fmt.Sprintf("%d shed", callers-workers-queue), func() bool {
		return p.Stats().Shed >= callers-workers-queue
	})
	// An admitted caller takes its queue place a moment after its place:
	// wait for the state, do not read it at an instant.
	waittest.Until(t, 5*time.Second, fmt.Sprintf("%d running, %d waiting", workers, queue), func() bool {
		st := p.Stats()
		return st.Running == workers && st.Waiting == queue
	})
	close(release)
	wg.Wait()
	close(results)
	var ok, shed int
	for err := range results {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrOverloaded):
			shed++
		default:
			t.Fatalf("Do: %v", err)
		}
	}
	if ok != workers+queue || shed != callers-workers-queue || ran.Load() != int64(ok) {
		t.Fatalf("accepted %d (ran %d), shed %d; want %d accepted and run, %d shed", ok, ran.Load(), shed, workers+queue, callers-workers-queue)
	}
}

func TestGoneClientDoesNoWork(t *testing.T) {
	p := newPool(t, Config{Min: 1, Max: 1, Queue: 4})
	block := make(chan struct{})
	started := make(chan struct{})
	go p.Do(context.Background(), func(context.Context) { close(started); <-block })
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	var called atomic.Bool
	done := make(chan error, 1)
	go func() { done <- p.Do(ctx, func(context.Context) { called.Store(true) }) }()
	waittest.Until(t, 10*time.Second, "pool stats", func() bool { return p.Stats().Waiting == 1 })
	cancel()
	// A caller queued inside ants cannot leave the queue early; when a
	// worker frees up, its task sees the context ended and does nothing.
	close(block)
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with the client gone = %v, want context.Canceled", err)
	}
	waittest.Until(t, 10*time.Second, "pool stats", func() bool { return p.Stats().Running == 0 })
	if called.Load() {
		t.Fatal("the task of a client that had gone was run")
	}
}

// TestPanicsInEveryWorker: every task panics, with callers queued behind
// (ants #146 stalled here): each gets ErrPanicked, nobody stalls, and the pool
// serves normally after.
func TestPanicsInEveryWorker(t *testing.T) {
	p := newPool(t, Config{Min: 2, Max: 2, Queue: 1000})
	const n = 300
	var wg sync.WaitGroup
	var panicked atomic.Int64
	for range n {
		wg.Go(func() {
			err := p.Do(context.Background(), func(context.Context) { panic("boom") })
			if errors.Is(err, ErrPanicked) {
				panicked.Add(1)
			} else {
				t.Errorf("Do(panicking task) = %v, want ErrPanicked", err)
			}
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatalf("stalled: %d of %d panicking tasks answered", panicked.Load(), n)
	}
	if got := p.Stats().Panics; got != n {
		t.Fatalf("Panics = %d, want %d", got, n)
	}
	if err := p.Do(context.Background(), func(context.Context) {}); err != nil {
		t.Fatalf("Do after panics = %v, want nil", err)
	}
}

// TestTuneUnderLoad: Tune races with Submit (ants #374) and the counters must
// come back to zero after frequent Tune (ants #196). Run with -race.
func TestTuneUnderLoad(t *testing.T) {
	p := newPool(t, Config{Min: 1, Max: 64, Queue: 10_000})
	stop := make(chan struct{})
	var tuner sync.WaitGroup
	tuner.Go(func() {
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			p.ants.Tune(1 + r.IntN(64))
			time.Sleep(50 * time.Microsecond)
		}
	})
	var wg sync.WaitGroup
	var ran atomic.Int64
	for range 16 {
		wg.Go(func() {
			for range 500 {
				if err := p.Do(context.Background(), func(context.Context) { ran.Add(1) }); err != nil {
					t.Errorf("Do: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	tuner.Wait()
	if ran.Load() != 16*500 {
		t.Fatalf("ran %d tasks, want %d", ran.Load(), 16*500)
	}
	waittest.Until(t, 10*time.Second, "pool stats", func() bool { st := p.Stats(); return st.Running == 0 && st.Waiting == 0 })
}

// TestTuneUpReleasesWaiters: callers blocked at capacity start as soon as the
// capacity grows, without waiting for a running task to end.
func TestTuneUpReleasesWaiters(t *testing.T) {
	p := newPool(t, Config{Min: 1, Max: 16, Queue: 100})
	block := make(chan struct{})
	defer close(block)
	started := make(chan struct{}, 10)
	go p.Do(context.Background(), func(context.Context) { started <- struct{}{}; <-block })
	<-started
	for range 5 {
		go p.Do(context.Background(), func(context.Context) { started <- struct{}{}; <-block })
	}
	waittest.Until(t, 10*time.Second, "pool stats", func() bool { return p.Stats().Waiting == 5 })
	p.ants.Tune(8)
	for i := range 5 {
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of 5 waiters started after Tune(8)", i)
		}
	}
}

// TestControlLoopResizes: the real control goroutine, on a short interval,
// grows the pool under load and shrinks it after.
func TestControlLoopResizes(t *testing.T) {
	p := newPool(t, Config{Min: 2, Max: 64, Interval: 20 * time.Millisecond})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = p.Do(context.Background(), func(context.Context) { time.Sleep(2 * time.Millisecond) })
			}
		})
	}
	waittest.Until(t, 10*time.Second, "pool stats", func() bool { return p.Stats().Capacity >= 16 })
	close(stop)
	wg.Wait()
	waittest.Until(t, 10*time.Second, "pool stats", func() bool { return p.Stats().Capacity == 2 })
}

func TestClosedPool(t *testing.T) {
	p, err := New(Config{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Do(context.Background(), func(context.Context) {}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close = %v, want ErrClosed", err)
	}
	if err := p.Close(time.Second); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{{Min: 10, Max: 5}, {Min: -1}, {Smoothing: 2}, {MaxShrink: 1.5}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) = nil error", cfg)
		}
	}
}

// TestAnAdmittedCallerIsNeverShed: a task's answer reaches its caller before
// ants has put the worker back on its idle list, so a caller admitted the
// moment another left could find every ants worker still busy. The places
// are counted by Admit; once a caller holds one, Run waits out that instant
// instead of refusing it (the trial's api suite answered a grab 503 here).
func TestAnAdmittedCallerIsNeverShed(t *testing.T) {
	for _, queue := range []int{-1, 1} {
		t.Run(fmt.Sprintf("queue=%d", queue), func(t *testing.T) {
			p := newPool(t, Config{Min: 1, Max: 1, Queue: queue})
			limit := 1 + max(queue, 0)
			var wg sync.WaitGroup
			var shed atomic.Int64
			for range limit {
				wg.Go(func() {
					for range 20_000 {
						err := p.Do(context.Background(), func(context.Context) {})
						if errors.Is(err, ErrOverloaded) {
							shed.Add(1)
						} else if err != nil {
							t.Errorf("Do = %v", err)
							return
						}
					}
				})
			}
			wg.Wait()
			if n := shed.Load(); n != 0 {
				t.Fatalf("%d of %d tasks shed with %d callers for %d places", n, limit*20_000, limit, limit)
			}
		})
	}
}
