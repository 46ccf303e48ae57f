package known

import (
	"context"
	"errors"
	"rain/internal/wait/waittest"
	"slices"
	"sync"
	"testing"
	"time"
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
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
}

// A pool whose notice was never published is learnt at the next refresh; a
// failing listing adds what it read and removes nothing.
func TestSyncRefresh(t *testing.T) {
	reg := &registry{ids: []string{"seed"}}
	f := New(Config{})
	run(t, NewSync(f, reg.list, SyncConfig{Refresh: 20 * time.Millisecond}))
	waittest.Until(t, time.Second, "first refresh", func() bool { return !f.MayContain("quiet") })

	reg.set([]string{"seed", "quiet"}, nil)
	waittest.Until(t, time.Second, `refresh learns "quiet"`, func() bool { return f.MayContain("quiet") })

	reg.set([]string{"partial"}, errors.New("shard s2 down"))
	waittest.Until(t, time.Second, `failed refresh adds "partial"`, func() bool { return f.MayContain("partial") })
	time.Sleep(100 * time.Millisecond) // several failed refreshes
	for _, id := range []string{"seed", "quiet", "partial"} {
		if !f.MayContain(id) {
			t.Errorf("MayContain(%q) after failed refreshes = false: a failure must not shrink the filter", id)
		}
	}

	reg.set([]string{"seed"}, nil)
	waittest.Until(t, time.Second, `refresh drops "quiet"`, func() bool { return !f.MayContain("quiet") })
}
