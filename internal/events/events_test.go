package events_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"rain/internal/events"
	"rain/internal/events/eventstest"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want events.Event
		ok   bool
	}{
		{"pool p1", events.Event{Kind: events.Pool, Pool: "p1"}, true},
		{"pool a:b.c-d_e", events.Event{Kind: events.Pool, Pool: "a:b.c-d_e"}, true},
		{"stock p1 0", events.Event{Kind: events.Stock, Pool: "p1"}, true},
		{"stock p1 17", events.Event{Kind: events.Stock, Pool: "p1", Sub: 17}, true},
		{"stock p1 999999999", events.Event{Kind: events.Stock, Pool: "p1", Sub: 999999999}, true},
		{"state p1", events.Event{Kind: events.State, Pool: "p1"}, true},
		{"state", events.Event{}, false},
		{"state p1 0", events.Event{}, false},
		{"", events.Event{}, false},
		{"pool", events.Event{}, false},
		{"pool ", events.Event{}, false},
		{"pool a b", events.Event{}, false},
		{"pool  a", events.Event{}, false},
		{"pool a\n", events.Event{}, false},
		{"POOL a", events.Event{}, false},
		{"stock p1", events.Event{}, false},
		{"stock p1 ", events.Event{}, false},
		{"stock  1", events.Event{}, false},
		{"stock p1 -1", events.Event{}, false},
		{"stock p1 +1", events.Event{}, false},
		{"stock p1 01", events.Event{}, false},
		{"stock p1 1 2", events.Event{}, false},
		{"stock p1 1x", events.Event{}, false},
		{"stock p1 1000000000", events.Event{}, false},
		{"sold p1 1", events.Event{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := events.Parse(tt.in)
			if !tt.ok {
				if !errors.Is(err, events.ErrMalformed) {
					t.Fatalf("events.Parse(%q) = %+v, %v; want events.ErrMalformed", tt.in, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("events.Parse(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
			if s := got.String(); s != tt.in {
				t.Fatalf("events.Parse(%q).String() = %q", tt.in, s)
			}
		})
	}
}

// FuzzParse: Parse never panics, accepts only canonical messages, and
// String inverts it.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"pool p1", "stock p1 3", "stock p 0", "pool", "stock p1 01", "pool a b", "stock p1 -1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := events.Parse(s)
		if err != nil {
			if !errors.Is(err, events.ErrMalformed) {
				t.Fatalf("events.Parse(%q) error %v is not events.ErrMalformed", s, err)
			}
			return
		}
		if got := e.String(); got != s {
			t.Fatalf("events.Parse(%q).String() = %q", s, got)
		}
		if e.Sub < 0 || e.Pool == "" || (e.Kind != events.Pool && e.Kind != events.Stock) {
			t.Fatalf("events.Parse(%q) = %+v", s, e)
		}
	})
}

func TestPublishRefusesMalformed(t *testing.T) {
	for _, e := range []events.Event{
		{Kind: events.Pool},
		{Kind: events.Pool, Pool: "a b"},
		{Kind: events.Stock, Pool: "p", Sub: -1},
		{Kind: 9, Pool: "p"},
	} {
		// No clients are needed: nothing may be sent.
		if err := events.Publish(context.Background(), nil, e); !errors.Is(err, events.ErrMalformed) {
			t.Errorf("events.Publish(%+v) = %v, want events.ErrMalformed", e, err)
		}
	}
}

// A shard that is down does not stop the notice on the others, and its
// error names it.
func TestPublishJoinsShardErrors(t *testing.T) {
	srvs := redistest.StartN(t, 2, redistest.Options{})
	up := redistest.Clients(t, srvs[:1])[0]
	down := shard.NewClient(srvs[1].Addr, shard.Options{}) // rain serve's client, retries included
	t.Cleanup(func() { _ = down.Close() })
	var r recorder
	listen(t, redistest.Clients(t, srvs[:1]), r.handlers())
	eventstest.WaitSubscribed(t, []redis.UniversalClient{up}, 1)
	srvs[1].Kill()

	err := events.Publish(context.Background(), []redis.UniversalClient{down, up}, events.Event{Kind: events.Pool, Pool: "p1"})
	if err == nil || !strings.Contains(err.Error(), srvs[1].Addr) {
		t.Fatalf("Publish with %s down = %v, want its error", srvs[1].Addr, err)
	}
	waitFor(t, &r, []string{"pool p1"})
}

// recorder collects what the handlers got.
type recorder struct {
	mu  sync.Mutex // guards got
	got []string
}

func (r *recorder) handlers() events.Handlers {
	return events.Handlers{
		Pool:  func(id string) { r.add(events.Event{Kind: events.Pool, Pool: id}) },
		Stock: func(pool string, j int) { r.add(events.Event{Kind: events.Stock, Pool: pool, Sub: j}) },
		State: func(id string) { r.add(events.Event{Kind: events.State, Pool: id}) },
	}
}

func (r *recorder) add(e events.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, e.String())
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(slices.Values(r.got))
}

func TestListenDispatches(t *testing.T) {
	srvs := redistest.StartN(t, 2, redistest.Options{})
	sub, pub := redistest.Clients(t, srvs), redistest.Clients(t, srvs)
	var r recorder
	listen(t, sub, r.handlers())
	eventstest.WaitSubscribed(t, pub, 1)

	ctx := context.Background()
	if err := events.Publish(ctx, pub, events.Event{Kind: events.Pool, Pool: "p1"}); err != nil {
		t.Fatal(err)
	}
	if err := events.Publish(ctx, pub, events.Event{Kind: events.Stock, Pool: "p1", Sub: 2}); err != nil {
		t.Fatal(err)
	}
	if err := events.Publish(ctx, pub, events.Event{Kind: events.State, Pool: "p1"}); err != nil {
		t.Fatal(err)
	}
	// Malformed messages and other channels are dropped.
	pub[0].Publish(ctx, events.Channel, "pool a b")
	pub[0].Publish(ctx, "other", "pool p2")

	// Each notice arrives once per shard.
	waitFor(t, &r, []string{"pool p1", "pool p1", "state p1", "state p1", "stock p1 2", "stock p1 2"})
}

// waitFor waits up to a second for the handlers to have got want (sorted).
func waitFor(t *testing.T, r *recorder, want []string) {
	t.Helper()
	waittest.Until(t, time.Second, fmt.Sprintf("handlers got %q, want %q", r.snapshot(), want), func() bool {
		return slices.Equal(r.snapshot(), want)
	})
}

func TestListenWithoutClientsReturns(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		events.Listen(context.Background(), nil, events.Config{}, events.Handlers{})
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("events.Listen(no clients) did not return")
	}
}

// listen runs Listen until the test ends and checks that it returns.
func listen(t *testing.T, cs []redis.UniversalClient, h events.Handlers) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); events.Listen(ctx, cs, events.Config{}, h) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Listen did not return after cancel")
		}
	})
}

// A shard that is down when Listen starts is subscribed to once it is up.
func TestListenShardDownAtStart(t *testing.T) {
	srvs := redistest.StartN(t, 1, redistest.Options{})
	srvs[0].Kill()
	var r recorder
	listen(t, redistest.Clients(t, srvs), r.handlers())
	time.Sleep(50 * time.Millisecond) // Listen is retrying
	srvs[0].Restart()
	pub := redistest.Clients(t, srvs)
	eventstest.WaitSubscribed(t, pub, 1)
	if err := events.Publish(context.Background(), pub, events.Event{Kind: events.Stock, Pool: "p", Sub: 0}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &r, []string{"stock p 0"})
}

// A shard killed and restarted under a live subscription still delivers the
// notices published on it afterwards: go-redis resubscribes.
func TestListenSurvivesShardRestart(t *testing.T) {
	srvs := redistest.StartN(t, 2, redistest.Options{})
	var r recorder
	listen(t, redistest.Clients(t, srvs), r.handlers())
	pub := redistest.Clients(t, srvs)
	eventstest.WaitSubscribed(t, pub, 1)

	srvs[0].Kill()
	srvs[0].Restart()
	eventstest.WaitSubscribed(t, pub[:1], 1) // back on shard 0

	// Only through the restarted shard.
	if err := events.Publish(context.Background(), pub[:1], events.Event{Kind: events.Pool, Pool: "after-restart"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &r, []string{"pool after-restart"})
}

// TestListenStopsOnAFrozenShard: a shard frozen (SIGSTOP) before it
// confirms the subscription does not hold Listen past ctx's end, so a
// stopping rain serve is not held up by it.
func TestListenStopsOnAFrozenShard(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := shard.NewClient(srv.Addr, shard.Options{}) // rain serve's client
	t.Cleanup(func() { _ = c.Close() })
	srv.Pause()
	t.Cleanup(srv.Resume)
	ctx, cancel := context.WithCancel(context.Background())
	subscribed := false
	done := make(chan struct{})
	go func() {
		defer close(done)
		events.Listen(ctx, []redis.UniversalClient{c}, events.Config{Subscribed: func() { subscribed = true }}, events.Handlers{})
	}()
	time.Sleep(300 * time.Millisecond) // Listen is waiting on the frozen shard
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Listen still running 5s after ctx ended, with its shard frozen")
	}
	if subscribed {
		t.Fatal("a frozen shard was counted as subscribed")
	}
}
