package known

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/events"
	"rain/internal/events/eventstest"
	"rain/internal/redistest"
)

// registry is a pool registry the test changes while a Sync lists it.
type registry struct {
	mu  sync.Mutex // guards ids and err
	ids []string
	err error
}

func (r *registry) set(ids []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids, r.err = ids, err
}

func (r *registry) list(context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids), r.err
}

// run runs s until the test ends and checks that Run returns.
func run(t *testing.T, s *Sync) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

// eventually polls cond every 5ms for up to d and reports how long it took.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// instance is one simulated rain instance: its own clients, filter and Sync.
func instance(t *testing.T, srvs []*redistest.Server, reg *registry, refresh time.Duration) (*Filter, []*redis.Client) {
	t.Helper()
	cs := redistest.Clients(t, srvs)
	f := New(Config{})
	run(t, NewSync(f, reg.list, SyncConfig{Refresh: refresh, Clients: cs}))
	// Until the first Reset the filter lets everything pass.
	eventually(t, time.Second, "first refresh", func() bool { return !f.MayContain("never-seen") })
	return f, cs
}

// A pool preloaded through one instance is known to the other within a
// second, by its notice alone (the registry never lists it here).
func TestSyncLearnsPublishedPool(t *testing.T) {
	srvs := redistest.StartN(t, 2, redistest.Options{})
	reg := &registry{ids: []string{"seed"}}
	_, csA := instance(t, srvs, reg, time.Hour)
	fB, _ := instance(t, srvs, reg, time.Hour)
	eventstest.WaitSubscribed(t, csA, "", 2)

	if fB.MayContain("fresh") {
		t.Fatal(`B: MayContain("fresh") before its notice = true`)
	}
	start := time.Now()
	if err := Publish(context.Background(), csA, "fresh"); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, `B learns "fresh"`, func() bool { return fB.MayContain("fresh") })
	t.Logf("B knew the pool %v after A published it", time.Since(start))
	if !fB.MayContain("seed") {
		t.Error(`B: MayContain("seed") = false`)
	}
}

// A pool whose notice was never published is learnt at the next refresh; a
// failing listing adds what it read and removes nothing.
func TestSyncRefresh(t *testing.T) {
	reg := &registry{ids: []string{"seed"}}
	f := New(Config{})
	run(t, NewSync(f, reg.list, SyncConfig{Refresh: 20 * time.Millisecond}))
	eventually(t, time.Second, "first refresh", func() bool { return !f.MayContain("quiet") })

	reg.set([]string{"seed", "quiet"}, nil)
	eventually(t, time.Second, `refresh learns "quiet"`, func() bool { return f.MayContain("quiet") })

	reg.set([]string{"partial"}, errors.New("shard s2 down"))
	eventually(t, time.Second, `failed refresh adds "partial"`, func() bool { return f.MayContain("partial") })
	time.Sleep(100 * time.Millisecond) // several failed refreshes
	for _, id := range []string{"seed", "quiet", "partial"} {
		if !f.MayContain(id) {
			t.Errorf("MayContain(%q) after failed refreshes = false: a failure must not shrink the filter", id)
		}
	}

	reg.set([]string{"seed"}, nil)
	eventually(t, time.Second, `refresh drops "quiet"`, func() bool { return !f.MayContain("quiet") })
}

// A shard killed and restarted still delivers the notices published on it
// afterwards: go-redis resubscribes.
func TestSyncSurvivesShardRestart(t *testing.T) {
	srvs := redistest.StartN(t, 2, redistest.Options{})
	reg := &registry{}
	f, _ := instance(t, srvs, reg, time.Hour)
	pub := redistest.Clients(t, srvs)
	eventstest.WaitSubscribed(t, pub, "", 1)

	srvs[0].Kill()
	srvs[0].Restart()
	eventstest.WaitSubscribed(t, pub[:1], "", 1) // the Sync is back on shard 0

	// Only through the restarted shard.
	if err := events.Publish(context.Background(), pub[:1], "", events.Event{Kind: events.Pool, Pool: "after-restart"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "notice through the restarted shard", func() bool { return f.MayContain("after-restart") })
}
