package known

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
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

// A pool whose notice was never published is learnt at the next refresh; a
// failing listing adds what it read and removes nothing. In a synctest
// bubble: each refresh is one tick of the fake clock, nothing sleeps.
func TestSyncRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const every = 20 * time.Millisecond
		reg := &registry{ids: []string{"seed"}}
		f := New(Config{})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); NewSync(f, reg.list, SyncConfig{Refresh: every}).Run(ctx) }()
		tick := func() { time.Sleep(every); synctest.Wait() }

		synctest.Wait() // the first refresh, at once
		if f.MayContain("quiet") || !f.MayContain("seed") {
			t.Fatal("after the first refresh the filter does not hold exactly the registry")
		}
		reg.set([]string{"seed", "quiet"}, nil)
		tick()
		if !f.MayContain("quiet") {
			t.Fatal(`the next refresh did not learn "quiet"`)
		}
		reg.set([]string{"partial"}, errors.New("shard s2 down"))
		for range 5 { // several failed refreshes
			tick()
		}
		for _, id := range []string{"seed", "quiet", "partial"} {
			if !f.MayContain(id) {
				t.Errorf("MayContain(%q) after failed refreshes = false: a failure adds what it read and must not shrink the filter", id)
			}
		}
		reg.set([]string{"seed"}, nil)
		tick()
		if f.MayContain("quiet") {
			t.Fatal(`a good refresh after the failures did not drop "quiet"`)
		}
		cancel()
		<-done
	})
}
