package settle_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// hangConfig is fastConfig("a") with the DeliverTimeout and patience
// given, and retries of at most 200 ms.
func hangConfig(deliver, patience time.Duration) settle.Config {
	cfg := fastConfig("a")
	cfg.DeliverTimeout, cfg.Patience, cfg.MaxRetryDelay = deliver, patience, 200*time.Millisecond
	return cfg
}

// confirmedWhileHung waits for every one of count grants of pool p to be
// confirmed.
func confirmedWhileHung(t *testing.T, ge *grabtest.Env, count int64) {
	t.Helper()
	waittest.Until(t, 20*time.Second, "every grant confirmed while the sink hangs", func() bool {
		st, err := ge.Catalog.Status(context.Background(), "p")
		return err == nil && st.ConfirmedCount == count
	})
}

// answer has the sink answer from now on, waits for every one of count
// grants to be paid and settlement to have caught up, and checks that
// none was paid twice.
func (s *hangSink) answer(t *testing.T, w *settle.Worker, count int) {
	t.Helper()
	close(s.release)
	waittest.Until(t, 30*time.Second, "every grant paid once the sink answers", func() bool {
		paid, _, _, _ := s.state()
		return paid == count && w.Stats().Lag == 0
	})
	if _, twice, _, _ := s.state(); twice != 0 {
		t.Fatalf("%d grants paid twice", twice)
	}
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
	cfg := hangConfig(time.Hour, 100*time.Millisecond)
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant outside the hung call paid", func() bool {
		paid, _, stuck, blocked := sink.state()
		return blocked == 1 && stuck > 0 && paid == count-stuck
	})
	if st, err := ge.Catalog.Status(context.Background(), "p"); err != nil || st.ConfirmedCount != count {
		t.Fatalf("while one delivery hangs: status %+v, %v; want all %d confirmed", st, err, count)
	}
	sink.answer(t, w, count)
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
			cfg := hangConfig(tc.timeout, 50*time.Millisecond)
			w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
			run(t, w)
			confirmedWhileHung(t, ge, count)
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
			sink.answer(t, w, count)
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
	cfg := hangConfig(300*time.Millisecond, 100*time.Millisecond)
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant but the hung one paid", func() bool {
		paid, _, stuck, _ := sink.state()
		return paid == count-1 && stuck > 1 // the hung call held others at first
	})
	sink.answer(t, w, count)
}

// trapSink hangs every call holding the first grant it is given (bad)
// until release; fails at once the first call holding the next grant (y),
// and makes later ones take slow. It counts the calls holding each, and
// the payouts.
type trapSink struct {
	release chan struct{}
	slow    time.Duration

	mu              sync.Mutex
	bad, y          int64
	badCalls, yCall int
	paid            map[int64]int
}

func (s *trapSink) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	s.mu.Lock()
	hasBad, hasY := false, false
	for _, g := range gs {
		switch {
		case s.bad == 0:
			s.bad = g.Serial
		case s.y == 0 && g.Serial != s.bad:
			s.y = g.Serial
		}
		hasBad = hasBad || g.Serial == s.bad
		hasY = hasY || g.Serial == s.y
	}
	if hasBad {
		s.badCalls++
	}
	if hasY {
		s.yCall++
	}
	first := s.yCall == 1
	s.mu.Unlock()
	switch {
	case hasBad:
		select {
		case <-s.release:
		case <-ctx.Done():
			for i := range errs {
				errs[i] = ctx.Err()
			}
			return errs
		}
	case hasY && first:
		for i := range errs {
			errs[i] = errors.New("wallet: 503")
		}
		return errs
	case hasY:
		time.Sleep(s.slow)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range gs {
		s.paid[g.Serial]++
	}
	return errs
}

// TestAHungCallKeepsItsEntries: a batch the pass went on without keeps
// its entries skipped for as long as it runs, though a later batch that
// met one of them (and skipped it) runs past the patience too and ends
// first: before, that batch's end cleared the marks of every entry of its
// read, the hung call's too, and the grant went to the sink in a second
// call while the first still hung (and was paid twice once both ended).
func TestAHungCallKeepsItsEntries(t *testing.T) {
	ge := grabtest.Start(t, 1, redistest.Options{})
	if _, _, err := ge.Catalog.Preload(context.Background(), rain.Spec{PoolID: "p", TotalCents: 1000, Count: 10, SubPools: 1}); err != nil {
		t.Fatal(err)
	}
	sink := &trapSink{release: make(chan struct{}), slow: 600 * time.Millisecond, paid: map[int64]int{}}
	cfg := hangConfig(time.Hour, 200*time.Millisecond)
	var passes atomic.Int64
	cfg.Held = func(string) bool { passes.Add(1); return false } // asked once a pass
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	grabAll(t, ge.Service, "p", "bad", 1)
	waittest.Until(t, 10*time.Second, "the call holding bad hangs", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.badCalls == 1
	})
	grabAll(t, ge.Service, "p", "y", 1)
	waittest.Until(t, 20*time.Second, "y paid after its failure, in a call slower than the patience", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.y != 0 && sink.paid[sink.y] == 1
	})
	// Passes after y's entry was acknowledged, while bad's call still
	// hangs: one of them would have sent bad again.
	waittest.Until(t, 10*time.Second, "y's entry acknowledged", func() bool {
		return (&env{shards: ge.Shards, cat: ge.Catalog}).outboxed(t) == 1
	})
	from := passes.Load()
	waittest.Until(t, 10*time.Second, "five passes more", func() bool { return passes.Load() >= from+5 })
	sink.mu.Lock()
	badCalls := sink.badCalls
	sink.mu.Unlock()
	if badCalls != 1 {
		t.Fatalf("bad went to the sink in %d calls while its first hung, want 1", badCalls)
	}
	close(sink.release)
	waittest.Until(t, 20*time.Second, "bad paid once the wallet answers", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.paid[sink.bad] >= 1 && w.Stats().Lag == 0
	})
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.paid[sink.bad] != 1 || sink.paid[sink.y] != 1 {
		t.Fatalf("bad paid %d times, y %d; want once each", sink.paid[sink.bad], sink.paid[sink.y])
	}
}

// TestAHungSinkCostsAPassOnePatienceAtMost: with every call to the sink
// hanging and a backlog of several reads in each of 16 outboxes, every
// grant is confirmed within seconds: once a wait for a place to call the
// sink has run out, batches settled one after another (the pages of a
// takeover) put their deliveries off at once. Before, each waited the
// patience for a place, and a pass lasted tens of seconds while the grants
// read after it waited unconfirmed (59 s for these 480 in one run).
func TestAHungSinkCostsAPassOnePatienceAtMost(t *testing.T) {
	ge := grabtest.Start(t, 1, redistest.Options{})
	const count = 480
	preloadAndGrab(t, ge, count, 16)
	sink := newHangSink(nil)
	cfg := hangConfig(time.Hour, 200*time.Millisecond)
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	confirmedWhileHung(t, ge, count)
	if most, _ := sink.mostBlocked(); most > 8 {
		t.Fatalf("%d calls hung at once on one shard, want at most 8", most)
	}
}

// TestAHungPartLeavesTheNextConfirmed: a read of entries of several grants
// (rain serve --outbox batch) is settled in parts of Batch grants; while
// the sink hangs on the first part's call, every part is confirmed all
// the same, so none runs out its hold. Before, each part was confirmed
// only once the part before it was delivered.
func TestAHungPartLeavesTheNextConfirmed(t *testing.T) {
	const count = 60
	e, _ := batchEnv(t, count, 1, 10, 0) // 6 entries of 10 grants: a read of 5 is 10 parts of 5
	sink := newHangSink(nil)
	cfg := hangConfig(time.Hour, 100*time.Millisecond)
	w := settle.New(e.shards, e.cat, sink, cfg)
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant confirmed while the sink hangs", func() bool { return e.confirmed(t) == count })
	if paid, _, _, _ := sink.state(); paid != 0 {
		t.Fatalf("%d paid while the sink hangs", paid)
	}
	sink.answer(t, w, count)
	e.assertAudit(t)
}

// TestGrantsTriedAloneHoldHalfThePlaces: grants tried each in a call of
// its own (their call of several ran out its time) hold at most half of a
// shard's 8 places to call the sink, so that a handful the wallet hangs on
// never leave the shard's other grants without one.
func TestGrantsTriedAloneHoldHalfThePlaces(t *testing.T) {
	ge := grabtest.Start(t, 1, redistest.Options{})
	const count = 80
	serials := preloadAndGrab(t, ge, count, 1)
	bad := map[int64]bool{}
	for i := 0; i < count; i += 10 { // one in each other call of 5
		bad[serials[i]] = true
	}
	var mu sync.Mutex
	var aloneNow, aloneMost, aloneCalls int
	sink := newHangSink(func(g settle.Grant) bool { return bad[g.Serial] })
	counted := sinkFunc(func(ctx context.Context, gs []settle.Grant) []error {
		lone := len(gs) == 1 && bad[gs[0].Serial]
		if lone {
			mu.Lock()
			aloneNow++
			aloneCalls++
			aloneMost = max(aloneMost, aloneNow)
			mu.Unlock()
			defer func() {
				mu.Lock()
				aloneNow--
				mu.Unlock()
			}()
		}
		return sink.Deliver(ctx, gs)
	})
	cfg := hangConfig(300*time.Millisecond, 100*time.Millisecond)
	w := settle.New(ge.Shards, ge.Catalog, counted, cfg)
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant but the hung ones paid, and the hung ones tried alone twice each", func() bool {
		paid, _, _, _ := sink.state()
		mu.Lock()
		defer mu.Unlock()
		return paid == count-len(bad) && aloneCalls >= 2*len(bad)
	})
	mu.Lock()
	most := aloneMost
	mu.Unlock()
	if most > 4 {
		t.Fatalf("%d calls of a grant tried alone hung at once, want at most 4 of the 8 places", most)
	}
	sink.answer(t, w, count)
}

// sinkFunc is a settle.Sink of a function.
type sinkFunc func(ctx context.Context, gs []settle.Grant) []error

func (f sinkFunc) Deliver(ctx context.Context, gs []settle.Grant) []error { return f(ctx, gs) }

// TestAGrantReleasedBeforeItsPartIsPaidIsNot: a read of entries of several
// grants is confirmed part by part, then delivered part by part; a part
// confirmed more than a second before its delivery is confirmed again
// first, and a grant its shard no longer holds confirmed (a host crash
// lost the confirm under --durability relaxed, and the reaper released
// it: here its record is written released by hand while the first part's
// call takes its time) is not paid, but settled as expired. Before, it was
// paid from the first confirm, its cents back in the stock too.
func TestAGrantReleasedBeforeItsPartIsPaidIsNot(t *testing.T) {
	const count = 20
	e, _ := batchEnv(t, count, 1, 10, 0) // 2 entries of 10: one read, 4 parts of 5
	var mu sync.Mutex
	var released int64 // the serial written released
	paid := map[int64]int{}
	sink := sinkFunc(func(ctx context.Context, gs []settle.Grant) []error {
		mu.Lock()
		first := len(paid) == 0 && released == 0
		mu.Unlock()
		if first {
			// The first part's call: a grant of a later part loses its
			// confirm meanwhile.
			subs, err := e.cat.SubPools(ctx)
			if err != nil || len(subs) != 1 {
				t.Errorf("sub-pools %v, %v", subs, err)
				return make([]error, len(gs))
			}
			k, c := subs[0].Keys(), e.shards.Client(subs[0].Shard)
			in := map[string]bool{}
			for _, g := range gs {
				in[g.UserID] = true
			}
			users, err := c.HKeys(ctx, k.Grants).Result()
			if err != nil {
				t.Errorf("HKEYS: %v", err)
			}
			for _, u := range users {
				rec, _ := c.HGet(ctx, k.Grants, u).Result()
				if in[u] || !strings.HasPrefix(rec, "c:") {
					continue
				}
				if err := c.HSet(ctx, k.Grants, u, "r:"+rec[2:]).Err(); err != nil {
					t.Errorf("HSET: %v", err)
				}
				var serial int64
				if _, err := fmt.Sscanf(strings.Split(rec, ":")[2], "%d", &serial); err != nil {
					t.Errorf("record %q: %v", rec, err)
				}
				mu.Lock()
				released = serial
				mu.Unlock()
				break
			}
			time.Sleep(1500 * time.Millisecond) // past the second after which a part is confirmed again
		}
		mu.Lock()
		defer mu.Unlock()
		for _, g := range gs {
			paid[g.Serial]++
		}
		return make([]error, len(gs))
	})
	w := settle.New(e.shards, e.cat, sink, hangConfig(time.Hour, time.Hour))
	run(t, w)
	waittest.Until(t, 30*time.Second, "every other grant paid, the released one settled unpaid", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return released != 0 && len(paid) == count-1 && w.Stats().Expired == 1 && w.Stats().Lag == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if paid[released] != 0 {
		t.Fatalf("the grant released before its part's delivery was paid %d times", paid[released])
	}
	for s, n := range paid {
		if n != 1 {
			t.Fatalf("serial %d paid %d times", s, n)
		}
	}
}
