package settle_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"rain"
	"rain/internal/grabtest"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/wait/waittest"
)

// hangSink hangs every delivery call that holds a grant hang says to
// hang (all of them while hang is nil), until release is closed or the
// call's context ends, and delivers every other call's grants. It counts
// each serial's payouts.
type hangSink struct {
	hang    func(settle.Grant) bool
	release chan struct{}

	mu      sync.Mutex
	paid    map[int64]int
	stuck   map[int64]bool // grants of the calls that hung
	calls   int
	blocked int // calls hanging now
	most    int // the most calls that hung at once
}

func newHangSink(hang func(settle.Grant) bool) *hangSink {
	return &hangSink{hang: hang, release: make(chan struct{}), paid: map[int64]int{}, stuck: map[int64]bool{}}
}

func (s *hangSink) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	hangs := false
	for _, g := range gs {
		hangs = hangs || s.hang == nil || s.hang(g)
	}
	s.mu.Lock()
	s.calls++
	if hangs {
		s.blocked++
		s.most = max(s.most, s.blocked)
		for _, g := range gs {
			s.stuck[g.Serial] = true
		}
	}
	s.mu.Unlock()
	if hangs {
		select {
		case <-s.release:
		case <-ctx.Done():
			s.mu.Lock()
			s.blocked--
			s.mu.Unlock()
			for i := range errs {
				errs[i] = ctx.Err()
			}
			return errs
		}
		s.mu.Lock()
		s.blocked--
		s.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range gs {
		s.paid[g.Serial]++
	}
	return errs
}

// mostBlocked is the most calls that hung at once, and how many calls
// were made.
func (s *hangSink) mostBlocked() (most, calls int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.most, s.calls
}

// state is how many serials were paid, how many of them more than once,
// how many grants were in calls that hung, and how many calls hang now.
func (s *hangSink) state() (paid, twice, stuck, blocked int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.paid {
		if n > 1 {
			twice++
		}
	}
	return len(s.paid), twice, len(s.stuck), s.blocked
}

// preloadAndGrab preloads pool p (count packets of 1 euro over subPools)
// and grants one to each of count users, returning their serials in the
// order granted.
func preloadAndGrab(t *testing.T, ge *grabtest.Env, count, subPools int) []int64 {
	t.Helper()
	if _, _, err := ge.Catalog.Preload(context.Background(), rain.Spec{PoolID: "p", TotalCents: int64(count) * 100, Count: int64(count), SubPools: subPools}); err != nil {
		t.Fatal(err)
	}
	grants := grabAll(t, ge.Service, "p", "u", count)
	serials := make([]int64, 0, count)
	for s := range grants {
		serials = append(serials, s)
	}
	slices.Sort(serials)
	return serials
}

// TestOneHungDeliverySlowsNoOther: a delivery that hangs (a wallet that
// never answers one account; DeliverTimeout an hour) holds up only the
// grants of its own call. The shard's other grants, many passes' worth,
// are confirmed and paid meanwhile: before, the pass waited for the hung
// call, so that every grant of the shard waited past its hold. Once the
// wallet answers, the held grants are paid too, each once.
func TestOneHungDeliverySlowsNoOther(t *testing.T) {
	ge := grabtest.Start(t, 1, redistest.Options{})
	const count = 60
	serials := preloadAndGrab(t, ge, count, 2)
	bad := serials[0]
	sink := newHangSink(func(g settle.Grant) bool { return g.Serial == bad })
	cfg := fastConfig("a")
	cfg.DeliverTimeout = time.Hour
	cfg.Patience = 100 * time.Millisecond
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant outside the hung call paid", func() bool {
		paid, _, stuck, blocked := sink.state()
		return blocked == 1 && stuck > 0 && paid == count-stuck
	})
	if st, err := ge.Catalog.Status(context.Background(), "p"); err != nil || st.ConfirmedCount != count {
		t.Fatalf("while one delivery hangs: status %+v, %v; want all %d confirmed", st, err, count)
	}
	close(sink.release)
	waittest.Until(t, 20*time.Second, "every grant paid once the wallet answers", func() bool {
		paid, _, _, _ := sink.state()
		return paid == count && w.Stats().Lag == 0
	})
	if _, twice, _, _ := sink.state(); twice != 0 {
		t.Fatalf("%d grants paid twice", twice)
	}
}

// TestASinkThatHangsForEveryoneLeavesEveryGrantConfirmed: while every
// delivery hangs, a worker keeps at most 8 calls in flight per shard (the
// streams of one read settled at once included; calls that time out and
// give their places to others included) and still confirms every grant
// (none runs out its hold for want of a payout); once the sink answers,
// every grant is paid, each once (the sink counts: a worker alone never
// delivers a grant twice). Before, the first hung call stopped the
// shard's confirms.
func TestASinkThatHangsForEveryoneLeavesEveryGrantConfirmed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		subPools int
		timeout  time.Duration // DeliverTimeout
	}{
		{"one outbox, calls that never end", 1, time.Hour},
		{"16 outboxes, calls that time out", 16, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ge := grabtest.Start(t, 1, redistest.Options{})
			const count = 80 // 5 entries a read: more reads than calls let hang
			preloadAndGrab(t, ge, count, tc.subPools)
			sink := newHangSink(nil)
			cfg := fastConfig("a")
			cfg.DeliverTimeout = tc.timeout
			cfg.Patience = 50 * time.Millisecond
			cfg.MaxRetryDelay = 200 * time.Millisecond
			w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
			run(t, w)
			waittest.Until(t, 20*time.Second, "every grant confirmed while the sink hangs", func() bool {
				st, err := ge.Catalog.Status(context.Background(), "p")
				return err == nil && st.ConfirmedCount == count
			})
			if tc.timeout > time.Minute {
				// The calls that hang never end: the grants confirmed after
				// them were never in a call.
				if paid, _, stuck, blocked := sink.state(); paid != 0 || blocked == 0 || stuck >= count {
					t.Fatalf("while the sink hangs: %d paid, %d calls hanging, %d grants in them (want fewer than %d)", paid, blocked, stuck, count)
				}
			} else {
				// Calls time out and others take their places: wait for a
				// few generations of them.
				waittest.Until(t, 20*time.Second, "four generations of calls", func() bool {
					_, calls := sink.mostBlocked()
					return calls > 4*8
				})
			}
			if most, _ := sink.mostBlocked(); most > 8 {
				t.Fatalf("%d calls hung at once on one shard, want at most 8", most)
			}
			close(sink.release)
			waittest.Until(t, 30*time.Second, "every grant paid once the sink answers", func() bool {
				paid, _, _, _ := sink.state()
				return paid == count && w.Stats().Lag == 0
			})
			if _, twice, _, _ := sink.state(); twice != 0 {
				t.Fatalf("%d grants paid twice", twice)
			}
		})
	}
}

// TestOneHungGrantHoldsNoCallMate: the grants that shared a call with
// the one the wallet hangs on are paid once that call runs out its
// DeliverTimeout: from then on they go to the sink in calls of their own,
// so only the hung grant waits. Before, they were tried again together,
// and hung together, for as long as the wallet hung on the one.
func TestOneHungGrantHoldsNoCallMate(t *testing.T) {
	ge := grabtest.Start(t, 1, redistest.Options{})
	const count = 20
	serials := preloadAndGrab(t, ge, count, 1)
	bad := serials[0]
	sink := newHangSink(func(g settle.Grant) bool { return g.Serial == bad })
	cfg := fastConfig("a")
	cfg.DeliverTimeout = 300 * time.Millisecond
	cfg.Patience = 100 * time.Millisecond
	cfg.MaxRetryDelay = 200 * time.Millisecond
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant but the hung one paid", func() bool {
		paid, _, stuck, _ := sink.state()
		return paid == count-1 && stuck > 1 // the hung call held others at first
	})
	close(sink.release)
	waittest.Until(t, 20*time.Second, "the hung grant paid once the wallet answers", func() bool {
		paid, _, _, _ := sink.state()
		return paid == count && w.Stats().Lag == 0
	})
	if _, twice, _, _ := sink.state(); twice != 0 {
		t.Fatalf("%d grants paid twice", twice)
	}
}
