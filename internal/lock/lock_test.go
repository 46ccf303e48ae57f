package lock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rain/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, redistest.IgnoreProbe())
}

const (
	// ttl is short so the tests are fast: the watchdog extends every 200ms.
	ttl = 600 * time.Millisecond
	// slack is what a loaded 2-core machine under -race may add to a timing.
	// It is generous so the tests are stable, yet ttl/3+slack stays below
	// ttl: a lost lock is reported by the watchdog, not by the validity timer.
	slack = 250 * time.Millisecond
)

// acquire takes name at once or fails the test; the lease is released when
// the test ends, if the test did not.
func acquire(t *testing.T, l *Locker, ctx context.Context, name string) *Lease {
	t.Helper()
	lease, err := l.tryAcquire(ctx, name)
	if err != nil {
		t.Fatalf("tryAcquire(%q) = %v, want a lease", name, err)
	}
	t.Cleanup(func() { lease.Release(context.Background()) })
	return lease
}

// ended waits up to within for the lease's context and returns how long it
// took, failing the test if it did not end.
func ended(t *testing.T, lease *Lease, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-lease.Context().Done():
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("lease context still live after %v (Err() = %v), want cancelled", within, lease.Err())
		return 0
	}
}

// held checks that the lease is still held after d.
func held(t *testing.T, lease *Lease, d time.Duration) {
	t.Helper()
	select {
	case <-lease.Context().Done():
		t.Fatalf("lease ended within %v: Err() = %v, want held", d, lease.Err())
	case <-time.After(d):
	}
}

func TestLostLock(t *testing.T) {
	srvs := redistest.StartN(t, 3, redistest.Options{})
	cs := redistest.Clients(t, srvs)
	l := New(cs, Config{TTL: ttl})
	tests := []struct {
		name     string
		shards   []int
		takeover bool // SET the key to another holder's value; else DEL it
		wantLost bool
	}{
		{name: "deleted everywhere", shards: []int{0, 1, 2}, wantLost: true},
		{name: "taken over everywhere", shards: []int{0, 1, 2}, takeover: true, wantLost: true},
		{name: "deleted on two of three", shards: []int{1, 2}, wantLost: true},
		{name: "taken over on two of three", shards: []int{0, 2}, takeover: true, wantLost: true},
		{name: "deleted on one of three", shards: []int{2}, wantLost: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "lock:test:" + t.Name()
			lease := acquire(t, l, t.Context(), key)
			// At least one extension went through; the loss comes anywhere
			// between two ticks.
			held(t, lease, ttl/3+rand.N(ttl/3))
			for _, i := range tt.shards {
				var err error
				if tt.takeover {
					err = cs[i].Set(t.Context(), key, "another holder", 10*time.Second).Err()
				} else {
					err = cs[i].Del(t.Context(), key).Err()
				}
				if err != nil {
					t.Fatalf("shard %d: %v", i, err)
				}
			}
			if !tt.wantLost {
				held(t, lease, 2*ttl)
				if err := lease.Release(t.Context()); err != nil {
					t.Errorf("Release() = %v, want nil", err)
				}
				return
			}
			took := ended(t, lease, 5*ttl)
			t.Logf("lease context cancelled %v after the loss", took)
			if took > ttl/3+slack {
				t.Errorf("lease context cancelled %v after the loss, want within TTL/3 = %v (+%v slack)", took, ttl/3, slack)
			}
			if err := lease.Err(); !errors.Is(err, ErrLost) {
				t.Errorf("Err() = %v, want ErrLost", err)
			}
			if err := lease.Release(t.Context()); err != nil {
				t.Errorf("Release() of a lost lease = %v, want nil", err)
			}
		})
	}
}

// TestNoTwoHolders runs two instances against each other: each takes the
// lock, checks it is alone inside, counts its win, and releases.
func TestNoTwoHolders(t *testing.T) {
	const rounds = 200
	srvs := redistest.StartN(t, 3, redistest.Options{})
	name := "lock:test:contended"
	var (
		inside atomic.Int32 // holders in the critical section
		mu     sync.Mutex   // guards taken and wins
		taken  int          // acquisitions, both contenders
		wins   [2]int
	)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range wins {
		l := New(redistest.Clients(t, srvs), Config{TTL: ttl, RetryDelay: 2 * time.Millisecond})
		wg.Go(func() {
			for {
				mu.Lock()
				done := taken >= rounds
				mu.Unlock()
				if done {
					return
				}
				lease, err := l.Acquire(ctx, name)
				if err != nil {
					t.Errorf("Acquire() = %v, want a lease", err)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders at once, want 1", n)
				}
				mu.Lock()
				taken++
				wins[i]++
				mu.Unlock()
				time.Sleep(rand.N(500 * time.Microsecond))
				if err := lease.Err(); err != nil {
					t.Errorf("Err() while holding = %v, want nil", err)
				}
				inside.Add(-1)
				if err := lease.Release(ctx); err != nil {
					t.Errorf("Release() = %v, want nil", err)
				}
				time.Sleep(rand.N(2 * time.Millisecond)) // let the other in
			}
		})
	}
	wg.Wait()
	if wins[0] == 0 || wins[1] == 0 {
		t.Errorf("wins = %v, want both contenders to hold the lock at times", wins)
	}
	t.Logf("%d acquisitions, wins %v", taken, wins)
}

func TestShardsDown(t *testing.T) {
	tests := []struct {
		name string
		kill []int
		want error // nil: acquired
	}{
		{name: "one of three", kill: []int{2}},
		{name: "two of three", kill: []int{1, 2}, want: ErrNotAcquired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srvs := redistest.StartN(t, 3, redistest.Options{})
			cs := redistest.Clients(t, srvs)
			l := New(cs, Config{TTL: ttl})
			for _, i := range tt.kill {
				srvs[i].Kill()
			}
			name := "lock:test:down"
			lease, err := l.tryAcquire(t.Context(), name)
			if !errors.Is(err, tt.want) {
				t.Fatalf("tryAcquire() = %v, want %v", err, tt.want)
			}
			if err != nil {
				// A failed attempt leaves nothing locked behind.
				for i, c := range cs {
					if slices.Contains(tt.kill, i) {
						continue
					}
					if n, err := c.Exists(t.Context(), name).Result(); err != nil || n != 0 {
						t.Errorf("EXISTS %s on shard %d = %d, %v; want 0", name, i, n, err)
					}
				}
				return
			}
			held(t, lease, 2*ttl) // extended on two of three
			if err := lease.Release(t.Context()); err != nil {
				t.Errorf("Release() = %v, want nil", err)
			}
		})
	}
}

// TestShardsDieWhileHeld: losing one shard of three keeps the lease; losing
// a second loses it. The bound is TTL here, not TTL/3: go-redis retries dial
// errors with backoff inside the extension, and what matters is that the
// holder hears of the loss before the lock can expire.
func TestShardsDieWhileHeld(t *testing.T) {
	srvs := redistest.StartN(t, 3, redistest.Options{})
	l := New(redistest.Clients(t, srvs), Config{TTL: ttl})
	lease := acquire(t, l, t.Context(), "lock:test:dying")
	srvs[2].Kill()
	held(t, lease, 2*ttl)
	srvs[1].Kill()
	took := ended(t, lease, 5*ttl)
	t.Logf("lease context cancelled %v after the quorum went", took)
	if took > ttl+slack {
		t.Errorf("lease context cancelled %v after the quorum went, want within TTL = %v (+%v slack)", took, ttl, slack)
	}
	if err := lease.Err(); !errors.Is(err, ErrLost) {
		t.Errorf("Err() = %v, want ErrLost", err)
	}
}

func TestRelease(t *testing.T) {
	srvs := redistest.StartN(t, 3, redistest.Options{})
	a := New(redistest.Clients(t, srvs), Config{TTL: ttl})
	b := New(redistest.Clients(t, srvs), Config{TTL: ttl})
	before := goleak.IgnoreCurrent()
	name := "lock:test:release"

	lease, err := a.tryAcquire(t.Context(), name)
	if err != nil {
		t.Fatalf("tryAcquire() = %v, want a lease", err)
	}
	held(t, lease, ttl/2) // the watchdog ran
	if err := lease.Release(t.Context()); err != nil {
		t.Fatalf("Release() = %v, want nil", err)
	}
	select {
	case <-lease.done:
	default:
		t.Errorf("watchdog still running after Release()")
	}
	if err := lease.Err(); !errors.Is(err, ErrReleased) {
		t.Errorf("Err() = %v, want ErrReleased", err)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Errorf("second Release() = %v, want nil", err)
	}
	other, err := b.tryAcquire(t.Context(), name)
	if err != nil {
		t.Fatalf("tryAcquire() by another at once after Release = %v, want a lease", err)
	}
	if err := other.Release(t.Context()); err != nil {
		t.Errorf("Release() = %v, want nil", err)
	}
	goleak.VerifyNone(t, before)
}

// TestGaveUp: Acquire's error once its ctx has ended wraps ErrNotAcquired
// and ctx's cause, also when the try before it failed only because the
// lock was taken (ctx ended between that try's answer and Acquire's look at
// ctx: TestAcquireContext met it on a loaded machine), and holds the cause
// once when the try had it already.
func TestGaveUp(t *testing.T) {
	ctx, cancel := context.WithDeadline(t.Context(), time.Now())
	defer cancel()
	<-ctx.Done()
	taken := fmt.Errorf("lock x: %w: %w", ErrNotAcquired, errors.New("lock already taken"))
	if err := gaveUp(ctx, taken); !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("gaveUp(taken) = %v, want ErrNotAcquired and context.DeadlineExceeded", err)
	}
	ended := fmt.Errorf("lock x: %w: %w", ErrNotAcquired, context.Cause(ctx))
	if err := gaveUp(ctx, ended); err != ended {
		t.Errorf("gaveUp(ended) = %v, want it as it was", err)
	}
}

// TestAcquireContext: the lease's context derives from Acquire's ctx, and
// Acquire waits until the lock is free or ctx ends.
func TestAcquireContext(t *testing.T) {
	srvs := redistest.StartN(t, 3, redistest.Options{})
	a := New(redistest.Clients(t, srvs), Config{TTL: ttl})
	b := New(redistest.Clients(t, srvs), Config{TTL: ttl, RetryDelay: 20 * time.Millisecond})

	t.Run("cancel ends the lease", func(t *testing.T) {
		name := "lock:test:" + t.Name()
		ctx, cancel := context.WithCancel(t.Context())
		lease := acquire(t, a, ctx, name)
		cancel()
		ended(t, lease, slack)
		if err := lease.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("Err() = %v, want context.Canceled", err)
		}
		// The reaper's deferred Release runs with its cancelled ctx.
		if err := lease.Release(ctx); err != nil {
			t.Errorf("Release(cancelled ctx) = %v, want nil", err)
		}
		acquire(t, b, t.Context(), name) // free at once
	})

	t.Run("waits for the holder", func(t *testing.T) {
		name := "lock:test:" + t.Name()
		lease := acquire(t, a, t.Context(), name)
		var (
			released atomic.Bool
			wg       sync.WaitGroup
		)
		defer wg.Wait()
		wg.Go(func() {
			time.Sleep(ttl / 2)
			released.Store(true)
			lease.Release(context.Background())
		})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		next, err := b.Acquire(ctx, name)
		if err != nil {
			t.Fatalf("Acquire() = %v, want a lease once the holder releases", err)
		}
		if !released.Load() {
			t.Errorf("Acquire() returned while the holder had not released")
		}
		if err := next.Release(t.Context()); err != nil {
			t.Errorf("Release() = %v, want nil", err)
		}
	})

	t.Run("gives up when ctx ends", func(t *testing.T) {
		name := "lock:test:" + t.Name()
		acquire(t, a, t.Context(), name)
		ctx, cancel := context.WithTimeout(t.Context(), ttl/2)
		defer cancel()
		start := time.Now()
		_, err := b.Acquire(ctx, name)
		if !errors.Is(err, ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire() = %v, want ErrNotAcquired and context.DeadlineExceeded", err)
		}
		if took := time.Since(start); took < ttl/2 {
			t.Errorf("Acquire() gave up after %v, want not before its ctx's deadline (%v)", took, ttl/2)
		}
	})
}
