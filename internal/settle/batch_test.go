package settle_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/catalog"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/logtest"
	"rain/internal/lua"
	"rain/internal/reaper"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

// batchEnv preloads pool "p" of count packets in subs sub-pools and grants
// them all in claim_many scripts of per claims each, as rain serve
// --outbox batch makes them under load: outbox entries of per grants. It
// returns the grants by serial.
func batchEnv(t *testing.T, count, subs, per int, hold int64) (*env, map[int64]grab.Result) {
	t.Helper()
	return formEnv(t, lua.OutboxBatch, count, subs, per, hold)
}

// formEnv is batchEnv with the outbox form given.
func formEnv(t *testing.T, outbox lua.OutboxForm, count, subs, per int, hold int64) (*env, map[int64]grab.Result) {
	t.Helper()
	ge := grabtest.Start(t, 2, redistest.Options{})
	ctx := context.Background()
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: "p", TotalCents: int64(count) * 100, Count: int64(count), SubPools: subs, HoldSeconds: hold}); err != nil {
		t.Fatal(err)
	}
	sps, err := ge.Catalog.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	form := lua.Form{Outbox: outbox, BatchedDeadlines: true}
	grants := map[int64]grab.Result{}
	serial := int64(1 << 40) // far from the generator's
	for _, sp := range sps {
		c, k := ge.Shards.Client(sp.Shard), sp.Keys()
		if err := lua.LoadScripts(ctx, c); err != nil {
			t.Fatal(err)
		}
		for empty := false; !empty; {
			claims := make([]lua.ClaimArg, per)
			for i := range claims {
				serial++
				claims[i] = lua.ClaimArg{User: fmt.Sprintf("u%d", serial), Serial: serial}
			}
			pipe := c.Pipeline()
			cmd := lua.ClaimManyCmd(ctx, pipe, &k, 0, false, form, claims, nil)
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			got, errs, err := lua.ParseClaimMany(cmd, per)
			if err != nil {
				t.Fatal(err)
			}
			for i, g := range got {
				switch {
				case errs[i] != nil:
					t.Fatal(errs[i])
				case g.Outcome == lua.Granted:
					grants[g.Serial] = grab.Result{Outcome: grab.Granted, Amount: g.Amount, Serial: g.Serial}
				default:
					empty = true
				}
			}
		}
	}
	if len(grants) != count {
		t.Fatalf("%d grants made, want %d", len(grants), count)
	}
	return &env{servers: ge.Servers, shards: ge.Shards, cat: ge.Catalog, svc: ge.Service}, grants
}

// counting is a sink that notes the largest delivery it was given.
type counting struct {
	settle.Sink
	mu      sync.Mutex
	largest int
}

func (s *counting) Deliver(ctx context.Context, gs []settle.Grant) []error {
	s.mu.Lock()
	s.largest = max(s.largest, len(gs))
	s.mu.Unlock()
	return s.Sink.Deliver(ctx, gs)
}

// TestEntriesOfABatchAreSettledInParts: one read of a sub-pool's outbox
// under --outbox batch holds 10,000 grants (79 entries of up to 128). One
// confirm of them all would fail in Lua (an HMGET of 10,000 users) on
// every pass, for good: they are confirmed and delivered in parts of at
// most Config.Batch grants, and every grant is paid once.
func TestEntriesOfABatchAreSettledInParts(t *testing.T) {
	e, grants := batchEnv(t, 10000, 1, 128, 0)
	if n := e.outboxed(t); n != 79 {
		t.Fatalf("%d outbox entries, want 79 of up to 128 grants", n)
	}
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	sink := &counting{Sink: openLedger(t, path)}
	cfg := fastConfig("a")
	cfg.Batch = 500
	w := settle.New(e.shards, e.cat, sink, cfg)
	stop := run(t, w)
	waittest.Until(t, 60*time.Second, "every outbox empty", func() bool { return e.outboxed(t) == 0 })
	stop()
	if st := w.Stats(); st.Delivered != 10000 || st.Failures != 0 || st.Anomalies != 0 {
		t.Fatalf("stats %+v: want 10,000 delivered, no failure, no anomaly", st)
	}
	if sink.largest > 500 {
		t.Fatalf("a delivery of %d grants; want parts of at most 500", sink.largest)
	}
	checkLedger(t, path, grants)
	if n := e.confirmed(t); n != 10000 {
		t.Fatalf("%d confirmed, want 10,000", n)
	}
	e.assertAudit(t)
}

// flaky is a sink that fails the first tries deliveries of one serial.
type flaky struct {
	settle.Sink
	serial int64
	mu     sync.Mutex
	tries  int
}

func (s *flaky) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	var rest []settle.Grant
	var at []int
	s.mu.Lock()
	for i, g := range gs {
		if g.Serial == s.serial && s.tries < 3 {
			s.tries++
			errs[i] = fmt.Errorf("the wallet is down")
			continue
		}
		rest, at = append(rest, g), append(at, i)
	}
	s.mu.Unlock()
	for j, err := range s.Sink.Deliver(ctx, rest) {
		errs[at[j]] = err
	}
	return errs
}

// TestOneGrantOfABatchLeftForAnOperator: in an entry of ten grants, one
// grant's serial was paid for another grant (a conflict) and another's
// delivery fails three times. The conflict leaves the entry pending for an
// operator, but its other grants are still retried on every pass until
// paid, the failing one included; nothing is paid twice. Once an operator
// clears the entry, nothing is left.
func TestOneGrantOfABatchLeftForAnOperator(t *testing.T) {
	e, grants := batchEnv(t, 40, 1, 10, 0)
	ctx := context.Background()
	c, k, entries := e.outbox(t, 4)
	key := k.Outbox
	es := grantsOf(t, entries[1], 10)
	victim, sibling := es[3].Serial, es[7].Serial
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	other := settle.Grant{Serial: victim, PoolID: "elsewhere", UserID: "someone", AmountCents: 1}
	if err := deliverOne(ctx, l, other); err != nil {
		t.Fatal(err)
	}
	sink := &flaky{Sink: l, serial: sibling}
	w := settle.New(e.shards, e.cat, sink, fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "every grant but the victim paid, its entry alone left", func() bool {
		st := w.Stats()
		return st.Delivered == 39 && st.Conflicts == 1 && st.LeftForOperator == 1 && e.outboxed(t) == 1
	})
	left, err := c.XRange(ctx, key, "-", "+").Result()
	if err != nil || len(left) != 1 || left[0].ID != entries[1].ID {
		t.Fatalf("outbox = %v, %v; want the victim's entry alone", left, err)
	}
	ledger := readLedger(t, path)
	if len(ledger) != 40 || ledger[victim] != other {
		t.Fatalf("ledger of %d lines, serial %d = %+v; want 40, the first grant under it kept", len(ledger), victim, ledger[victim])
	}
	for serial, r := range grants {
		if serial != victim && ledger[serial].AmountCents != r.Amount {
			t.Fatalf("ledger line of serial %d = %+v, want %d cents", serial, ledger[serial], r.Amount)
		}
	}
	// The operator, having checked every grant of the entry (the runbook),
	// clears it.
	clearEntry(t, c, key, left[0].ID, w)
	stop()
	if st := w.Stats(); st.Conflicts != 1 || st.Delivered != 39 {
		t.Fatalf("stats %+v: want the conflict counted once, and 39 grants delivered once each over every pass", st)
	}
}

// TestReleasedGrantsOfABatchAreNotPaid: the grants of entries of eight,
// released at their deadline before settlement reads them, are not paid,
// and their entries are acknowledged.
func TestReleasedGrantsOfABatchAreNotPaid(t *testing.T) {
	e, _ := batchEnv(t, 24, 2, 8, 1)
	checkReleasedNotPaid(t, e, 24)
}

// TestUnpaidGrantsAreNotConfirmedAgain: the grants of a read that were
// released at their deadline are settled unpaid as they were found, in the
// pass that read them, even in a part delivered more than a second after
// its confirm (whose grants to pay are confirmed again first, in case the
// shard lost the confirm): confirmed again, a released grant would be
// found not confirmed and put off to a later pass, logged as such.
func TestUnpaidGrantsAreNotConfirmedAgain(t *testing.T) {
	e, _ := batchEnv(t, 24, 1, 8, 1)
	e.releaseDue(t, 24)
	sink := &slowFirst{memSink: newMemSink(0), delay: 1100 * time.Millisecond, during: func() {}}
	sink.records = true
	cfg := fastConfig("a")
	var log logtest.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	w := settle.New(e.shards, e.cat, sink, cfg)
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "every entry handled", func() bool { return w.Stats().Expired == 24 && e.outboxed(t) == 0 })
	stop()
	if first, last := sink.calls(); last.Sub(first) <= 0 {
		t.Fatalf("the sink's first call ended %v, its last began %v: want a part delivered after the slow first one", first, last)
	}
	if strings.Contains(log.String(), "not paid now") {
		t.Fatalf("grants settled unpaid were confirmed again and put off:\n%s", log.String())
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.unpaid) != 24 || len(sink.paid) != 0 {
		t.Fatalf("%d grants recorded unpaid and %d paid; want the 24 released, none paid", len(sink.unpaid), len(sink.paid))
	}
}

// memSink pays each serial once (it dedupes, as every sink must), counts
// every delivery of each serial, and takes delay per Deliver call (a
// wallet or a database that takes its time).
type memSink struct {
	delay time.Duration
	mu    sync.Mutex
	paid  map[int64]settle.Grant
	calls map[int64]int
	fail  map[int64]bool // serials whose delivery fails (not a conflict)
	// records: the sink records the grants settled unpaid (in unpaid),
	// settle.RecordsUnpaid.
	records     bool
	unpaid      map[int64]settle.Grant
	unpaidCalls map[int64]int
}

func newMemSink(delay time.Duration) *memSink {
	return &memSink{delay: delay, paid: map[int64]settle.Grant{}, calls: map[int64]int{}, fail: map[int64]bool{},
		unpaid: map[int64]settle.Grant{}, unpaidCalls: map[int64]int{}}
}

func (s *memSink) RecordsUnpaid() bool { return s.records }

func (s *memSink) Deliver(ctx context.Context, gs []settle.Grant) []error {
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
		}
	}
	errs := make([]error, len(gs))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, g := range gs {
		if ctx.Err() != nil {
			errs[i] = ctx.Err()
			continue
		}
		if g.Unpaid != "" {
			s.unpaidCalls[g.Serial]++
		} else {
			s.calls[g.Serial]++
		}
		if s.fail[g.Serial] {
			errs[i] = fmt.Errorf("the wallet refuses %d for now", g.Serial)
			continue
		}
		if g.Unpaid != "" {
			if p, ok := s.paid[g.Serial]; ok {
				errs[i] = settle.ErrPaid
				if !p.Same(g) {
					errs[i] = settle.ErrSerialConflict
				}
			} else if u, ok := s.unpaid[g.Serial]; !ok {
				s.unpaid[g.Serial] = g
			} else if !u.Same(g) {
				errs[i] = settle.ErrSerialConflict
			}
			continue
		}
		if u, ok := s.unpaid[g.Serial]; ok {
			errs[i] = settle.ErrSettledUnpaid
			if !u.Same(g) {
				errs[i] = settle.ErrSerialConflict
			}
			continue
		}
		if p, ok := s.paid[g.Serial]; ok {
			if !p.Same(g) {
				errs[i] = settle.ErrSerialConflict
			}
			continue
		}
		s.paid[g.Serial] = g
	}
	return errs
}

// stats is how many serials were paid, and how many deliveries were of a
// serial delivered before.
func (s *memSink) stats() (paid, again int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.calls {
		again += max(0, n-1)
	}
	return len(s.paid), again
}

// checkPaid checks that sink paid every grant once, at its amount.
func (s *memSink) checkPaid(t *testing.T, grants map[int64]grab.Result) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.paid) != len(grants) {
		t.Fatalf("%d serials paid, want %d", len(s.paid), len(grants))
	}
	for serial, r := range grants {
		if s.paid[serial].AmountCents != r.Amount {
			t.Fatalf("serial %d paid %+v, want %d cents", serial, s.paid[serial], r.Amount)
		}
	}
}

// checkPaidOnce is checkPaid, and checks that w counted a failure and
// delivered each grant once, and that no grant went to the sink twice.
func (s *memSink) checkPaidOnce(t *testing.T, w *settle.Worker, grants map[int64]grab.Result) {
	t.Helper()
	s.checkPaid(t, grants)
	if _, again := s.stats(); again != 0 {
		t.Fatalf("%d deliveries of grants delivered before", again)
	}
	if st := w.Stats(); st.Failures == 0 || st.Delivered != int64(len(grants)) {
		t.Fatalf("stats %+v: want the failure counted, and %d grants delivered", st, len(grants))
	}
}

// TestNoTakeoverWhileAReadIsSettled: two workers, a sink that takes 20 ms
// a delivery, claim-after 1 s, reads of 20 entries. Under --outbox batch
// one read is 2,560 grants in 128 parts, seconds of work: after each part
// the worker acknowledges what it settled and claims the rest of its read
// again, so the other worker never takes it over and nothing is delivered
// twice, as under --outbox packed, where a read is one part.
func TestNoTakeoverWhileAReadIsSettled(t *testing.T) {
	for _, form := range []lua.OutboxForm{lua.OutboxPacked, lua.OutboxBatch} {
		t.Run(form.String(), func(t *testing.T) {
			e, grants := formEnv(t, form, 2560, 1, 128, 0)
			sink := newMemSink(20 * time.Millisecond)
			cfg := func(name string) settle.Config {
				return settle.Config{Consumer: name, Batch: 20, Block: 50 * time.Millisecond, Refresh: 50 * time.Millisecond,
					ClaimAfter: time.Second, RetryDelay: 20 * time.Millisecond}
			}
			a := settle.New(e.shards, e.cat, sink, cfg("a"))
			b := settle.New(e.shards, e.cat, sink, cfg("b"))
			stopA, stopB := run(t, a), run(t, b)
			waittest.Until(t, 120*time.Second, "every outbox empty", func() bool { return e.outboxed(t) == 0 })
			stopA()
			stopB()
			sink.checkPaid(t, grants)
			if _, again := sink.stats(); again != 0 {
				t.Fatalf("%d deliveries of grants delivered before (a %+v, b %+v): a read was taken over while its worker settled it",
					again, a.Stats(), b.Stats())
			}
			e.assertAudit(t)
		})
	}
}

// TestAConfirmAgainThatFailsIsCounted: an entry of ten grants read in
// two parts of five; the first part's delivery takes over a second, so
// the second part is confirmed again before its delivery, and that
// confirm is lost, beyond go-redis's retries. The second part is paid on
// a later pass, no sooner than the entry's retry delay after the failure
// (put off, as after a first confirm's failure), every grant once, and
// the failure is counted (what RainSettlementFailing watches).
func TestAConfirmAgainThatFailsIsCounted(t *testing.T) {
	e, grants := batchEnv(t, 10, 1, 10, 0)
	set, cat, proxies, _ := e.doomed(t)
	sink := &slowFirst{memSink: newMemSink(0), delay: 1100 * time.Millisecond}
	sink.during = func() {
		for _, p := range proxies {
			p.DropRequests(redisproxy.Script(lua.SHA("confirm_many")), 4)
		}
	}
	cfg := fastConfig("a")
	cfg.RetryDelay = 2 * time.Second
	w := settle.New(set, cat, sink, cfg)
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "every outbox empty", func() bool { return e.outboxed(t) == 0 })
	stop()
	sink.checkPaidOnce(t, w, grants)
	if first, last := sink.calls(); last.Sub(first) < cfg.RetryDelay {
		t.Fatalf("the second part was paid %v after the first part's delivery ended; want no sooner than the retry delay, %v",
			last.Sub(first), cfg.RetryDelay)
	}
	e.assertAudit(t)
}

// slowFirst is a sink whose first call takes delay, calling during at its
// start.
type slowFirst struct {
	*memSink
	delay  time.Duration
	during func()
	once   sync.Once

	mu              sync.Mutex
	firstEnd, lastC time.Time // when the first call ended, when the last began
}

func (s *slowFirst) Deliver(ctx context.Context, gs []settle.Grant) []error {
	first := false
	s.once.Do(func() {
		first = true
		s.during()
		time.Sleep(s.delay)
	})
	s.mu.Lock()
	if first {
		s.firstEnd = time.Now()
	} else {
		s.lastC = time.Now()
	}
	s.mu.Unlock()
	return s.memSink.Deliver(ctx, gs)
}

// calls is when the first call ended and the last began.
func (s *slowFirst) calls() (firstEnd, last time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstEnd, s.lastC
}

// TestAWorkerTakesOverMidEntry: worker a pays every grant of an entry of
// 128 but one, whose delivery keeps failing; a stops; b takes the entry
// over and pays the rest. Every grant is paid once, the entry acknowledged.
func TestAWorkerTakesOverMidEntry(t *testing.T) {
	e, grants := batchEnv(t, 256, 1, 128, 0)
	_, _, entries := e.outbox(t, 2)
	es := grantsOf(t, entries[0], 128)
	victim := es[100].Serial
	sink := newMemSink(0)
	sink.fail[victim] = true
	a := settle.New(e.shards, e.cat, sink, fastConfig("a"))
	stopA := run(t, a)
	waittest.Until(t, 20*time.Second, "all but the victim paid", func() bool { paid, _ := sink.stats(); return paid == 255 })
	stopA()
	sink.mu.Lock()
	delete(sink.fail, victim)
	sink.mu.Unlock()
	b := settle.New(e.shards, e.cat, sink, fastConfig("b"))
	stopB := run(t, b)
	waittest.Until(t, 20*time.Second, "every outbox empty", func() bool { return e.outboxed(t) == 0 })
	stopB()
	sink.checkPaid(t, grants)
	e.assertAudit(t)
}

// TestGrantsOfAWaitingEntryAreCountedOnce: an entry of 10 grants, one
// confirmed whose serial the sink paid for another grant (left for an
// operator), the other nine released at their deadline before settlement
// read them. While the entry waits, every pass confirms the nine again,
// but counts them as expired once.
func TestGrantsOfAWaitingEntryAreCountedOnce(t *testing.T) {
	e, _ := batchEnv(t, 10, 1, 10, 1)
	ctx := context.Background()
	c, k, entries := e.outbox(t, 1)
	es := grantsOf(t, entries[0], 10)
	victim := es[0]
	if _, _, err := lua.ConfirmMany(ctx, c, &k, []lua.ConfirmArg{{User: victim.User, Serial: victim.Serial, Amount: victim.Amount}}); err != nil {
		t.Fatal(err)
	}
	e.releaseDue(t, 9) // the other nine
	sink := newMemSink(0)
	sink.paid[victim.Serial] = settle.Grant{Serial: victim.Serial, PoolID: "elsewhere", UserID: "x", AmountCents: 1}
	w := settle.New(e.shards, e.cat, sink, fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 10*time.Second, "the entry left for an operator", func() bool { return w.Stats().LeftForOperator == 1 })
	time.Sleep(time.Second) // many passes over the waiting entry
	stop()
	if st := w.Stats(); st.Expired != 9 || st.Conflicts != 1 || st.Delivered != 0 {
		t.Fatalf("stats %+v: want the nine released grants counted once, one conflict, nothing delivered", st)
	}
	if n := e.outboxed(t); n != 1 {
		t.Fatalf("%d outbox entries, want the waiting one", n)
	}
}

// lostConfirm is a sink that, the first time it is given at least n
// grants, delivers them and then plays a shard that lost the writes made
// since restore's snapshot (the confirm of those grants: a failover to a
// replica without it, an AOF tail lost under --durability relaxed) and is
// out of reach for a moment (the worker's acknowledgment fails).
type lostConfirm struct {
	*memSink
	n       int
	once    sync.Once
	restore func()
	cut     func()
}

func (s *lostConfirm) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := s.memSink.Deliver(ctx, gs)
	if len(gs) >= s.n {
		s.once.Do(func() { s.restore(); s.cut() })
	}
	return errs
}

// TestALostConfirmIsMadeAgain: an entry's grants are confirmed and paid;
// the shard then loses the confirm (the records held again) and the
// worker's acknowledgment fails. The entry is read again and each grant is
// confirmed again (confirm is idempotent: it heals), in either form; a
// worker that skipped the grants it paid would acknowledge the entry with
// the grants still held, and the reaper would put their amounts back in
// the stock, to be granted and paid a second time.
func TestALostConfirmIsMadeAgain(t *testing.T) {
	for _, form := range []lua.OutboxForm{lua.OutboxPacked, lua.OutboxBatch} {
		t.Run(form.String(), func(t *testing.T) {
			e, grants := formEnv(t, form, 10, 1, 10, 1)
			ctx := context.Background()
			subs, err := e.cat.SubPools(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c, k := e.shards.Client(subs[0].Shard), subs[0].Keys()
			was := snapshot(t, c, k)
			set, cat, proxies, _ := e.doomed(t)
			sink := &lostConfirm{memSink: newMemSink(0), n: 10}
			sink.restore = func() { was.restore(t) }
			sink.cut = func() {
				for _, p := range proxies {
					p.Partition()
				}
				time.AfterFunc(700*time.Millisecond, func() {
					for _, p := range proxies {
						p.Heal()
					}
				})
			}
			cfg := fastConfig("a")
			cfg.Batch = 500
			w := settle.New(set, cat, sink, cfg)
			stop := run(t, w)
			waittest.Until(t, 20*time.Second, "every outbox empty", func() bool { return e.outboxed(t) == 0 })
			stop()
			sink.checkPaid(t, grants)
			if n := e.confirmed(t); n != 10 {
				t.Fatalf("%d grants confirmed after settlement, want the 10 paid", n)
			}
			// The worker remembers it paid them (the entries were still
			// pending, their acknowledgment failed): each confirm made again
			// is an anomaly, logged.
			if st := w.Stats(); st.Anomalies != 10 {
				t.Fatalf("stats %+v: want 10 anomalies (a paid grant confirmed again)", st)
			}
			reap := reaper.New(e.shards, e.cat, nil, reaper.Config{})
			var sw reaper.Sweep
			waittest.Until(t, 10*time.Second, "a sweep past the grants' deadline", func() bool {
				past := time.Now().UnixMilli() > dueAfter(was.due)+100 // the shard's clock is this machine's
				if sw, err = reap.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
				return sw.Released > 0 || past
			})
			if sw.Released != 0 {
				t.Fatalf("%d paid grants released back to the stock", sw.Released)
			}
			e.assertAudit(t)
		})
	}
}

// subPoolState is a sub-pool's records (its meta, its grants, its
// deadline index's batches) as they were when read.
type subPoolState struct {
	c            redis.UniversalClient
	k            rain.Keys
	meta, grants map[string]string
	due          []redis.Z
}

// snapshot reads sub-pool k's records on c; there must be a member of
// the deadline index's batches.
func snapshot(t *testing.T, c redis.UniversalClient, k rain.Keys) *subPoolState {
	t.Helper()
	ctx := context.Background()
	s := &subPoolState{c: c, k: k}
	var err error
	if s.meta, err = c.HGetAll(ctx, k.Meta).Result(); err != nil {
		t.Fatal(err)
	}
	if s.grants, err = c.HGetAll(ctx, k.Grants).Result(); err != nil {
		t.Fatal(err)
	}
	if s.due, err = c.ZRangeWithScores(ctx, k.Batches, 0, -1).Result(); err != nil || len(s.due) == 0 {
		t.Fatalf("deadline index = %v, %v; want a member", s.due, err)
	}
	return s
}

// restore writes the records back as they were: the shard lost every
// write to them since (a failover to a replica behind, an AOF tail lost).
func (s *subPoolState) restore(t *testing.T) {
	ctx := context.Background()
	pipe := s.c.TxPipeline()
	pipe.Del(ctx, s.k.Meta, s.k.Grants)
	pipe.HSet(ctx, s.k.Meta, s.meta)
	pipe.HSet(ctx, s.k.Grants, s.grants)
	pipe.ZAdd(ctx, s.k.Batches, s.due...)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Error(err)
	}
}

// waitDue waits until the shard's clock is past every deadline s holds.
func (s *subPoolState) waitDue(t *testing.T) {
	t.Helper()
	waittest.Until(t, 10*time.Second, "the grants' deadline passed", func() bool {
		tm, err := s.c.Time(context.Background()).Result()
		return err == nil && tm.UnixMilli() > dueAfter(s.due)
	})
}

// dueAfter is the latest deadline of the deadline index's members.
func dueAfter(due []redis.Z) int64 {
	var last int64
	for _, z := range due {
		last = max(last, int64(z.Score))
	}
	return last
}

// loseAfterPay is a sink that, once it has paid serial victim, plays the
// shard losing the confirm (after: its records as they were before it),
// the reaper releasing the grants past their deadline, and perhaps the
// victim's user grabbing again.
type loseAfterPay struct {
	*memSink
	victim int64
	once   sync.Once
	after  func()
}

func (s *loseAfterPay) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := s.memSink.Deliver(ctx, gs)
	for i, g := range gs {
		if g.Serial == s.victim && errs[i] == nil {
			s.once.Do(s.after)
		}
	}
	return errs
}

// pair is pool "p" of one sub-pool whose two grants, held one second, are
// in one outbox entry (--outbox batch), past their deadline, and the
// sub-pool's records as they were before settlement (was).
type pair struct {
	env             *env
	c               redis.UniversalClient
	k               rain.Keys
	entries         []redis.XMessage
	victim, sibling lua.OutboxEntry
	was             *subPoolState
}

func newPair(t *testing.T) pair {
	t.Helper()
	e, _ := batchEnv(t, 2, 1, 2, 1)
	c, k, entries := e.outbox(t, 1)
	es := grantsOf(t, entries[0], 2)
	was := snapshot(t, c, k)
	was.waitDue(t)
	return pair{env: e, c: c, k: k, entries: entries, victim: es[0], sibling: es[1], was: was}
}

// TestAPaidGrantNoLongerConfirmedIsLeftForAnOperator: an entry of two
// grants; the victim is confirmed and paid, its sibling's delivery fails
// (the entry waits). The shard then loses the victim's confirm and the
// reaper releases both, and perhaps the victim's user is granted again
// under a new serial (confirm then answers a mismatch, not a release).
// Either way the worker that paid the victim leaves the entry for an
// operator: the amount it paid is back in the stock.
func TestAPaidGrantNoLongerConfirmedIsLeftForAnOperator(t *testing.T) {
	for _, regrant := range []bool{false, true} {
		t.Run(map[bool]string{false: "released", true: "granted-again"}[regrant], func(t *testing.T) {
			pe := newPair(t)
			e, c, k, entries, victim, sibling, was := pe.env, pe.c, pe.k, pe.entries, pe.victim, pe.sibling, pe.was
			ctx := context.Background()
			sink := &loseAfterPay{memSink: newMemSink(0), victim: victim.Serial}
			sink.fail[sibling.Serial] = true
			sink.after = func() {
				was.restore(t)
				sw, err := reaper.New(e.shards, e.cat, nil, reaper.Config{}).Sweep(ctx)
				if err != nil || sw.Released != 2 {
					t.Errorf("sweep = %+v, %v; want the 2 grants released", sw, err)
				}
				if regrant {
					got, errs, err := lua.ClaimMany(ctx, c, &k, 0, []lua.ClaimArg{{User: victim.User, Serial: 1 << 41}})
					if err != nil || errs[0] != nil || got[0].Outcome != lua.Granted {
						t.Errorf("the victim's user grabs again: %+v, %v, %v; want granted", got, errs, err)
					}
				}
			}
			w := settle.New(e.shards, e.cat, sink, fastConfig("a"))
			stop := run(t, w)
			waittest.Until(t, 20*time.Second, "the entry left for an operator", func() bool {
				st := w.Stats()
				return st.Conflicts == 1 && st.LeftForOperator == 1
			})
			stop()
			left, err := c.XRange(ctx, k.Outbox, "-", "+").Result()
			if err != nil || len(left) == 0 || left[0].ID != entries[0].ID {
				t.Fatalf("outbox = %v, %v; want the victim's entry still there", left, err)
			}
		})
	}
}

// TestAPaidGrantAloneNoLongerConfirmedIsLeftForAnOperator: two grants
// alone in their entries (--outbox packed) are confirmed and paid, and the
// acknowledgment of their entries is lost, beyond go-redis's retries. The
// shard then loses the confirms and the reaper releases the grants. The
// worker that paid them leaves the entries for an operator, as it does the
// grants of an entry of several: settled as released unpaid, the amounts
// it paid would be back in the stock, to be granted and paid again, with
// nothing left pending to say so.
func TestAPaidGrantAloneNoLongerConfirmedIsLeftForAnOperator(t *testing.T) {
	lp := newLostAfterPay(t, false)
	ctx, c, k, sink := context.Background(), lp.c, lp.k, lp.sink
	w := settle.New(lp.set, lp.cat, sink, fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "the entries left for an operator", func() bool {
		st := w.Stats()
		return st.Conflicts == 2 && st.LeftForOperator == 2
	})
	time.Sleep(300 * time.Millisecond) // passes over the entries waiting
	if n := settle.Marked(w); n != 2 {
		t.Fatalf("%d grants marked, want the 2 paid, their entries still pending", n)
	}
	stop()
	if st := w.Stats(); st.Delivered != 2 || st.Expired != 0 {
		t.Fatalf("stats %+v: want the grants delivered once each, none taken for released unpaid", st)
	}
	if paid, again := sink.stats(); paid != 2 || again != 0 {
		t.Fatalf("the sink paid %d grants, %d again; want 2, none again", paid, again)
	}
	if left, err := c.XLen(ctx, k.Outbox).Result(); err != nil || left != 2 {
		t.Fatalf("outbox = %d entries, %v; want the 2 still there", left, err)
	}
}

// lostAfterPay is pool "p" of one sub-pool whose two grants, alone in
// their entries (--outbox packed), are past their deadline; set and cat
// reach its shards through proxies that drop the acknowledgment of their
// entries beyond go-redis's retries, and sink (recording unpaid grants
// when records) has the shard lose the confirms (its records as they
// were) and the reaper release both grants once it pays the first
// (released is closed then).
type lostAfterPay struct {
	e        *env
	c        redis.UniversalClient
	k        rain.Keys
	set      *shard.Set
	cat      *catalog.Catalog
	sink     *loseAfterPay
	released chan struct{}
}

func newLostAfterPay(t *testing.T, records bool) lostAfterPay {
	t.Helper()
	e, _ := formEnv(t, lua.OutboxPacked, 2, 1, 2, 1) // the deadline index names the two in one member
	c, k, entries := e.outbox(t, 2)
	victim := grantsOf(t, entries[0], 1)[0]
	was := snapshot(t, c, k)
	was.waitDue(t)
	set, cat, proxies, _ := e.doomed(t)
	for _, p := range proxies {
		p.DropRequests(redisproxy.Script(lua.SHA("acknowledge")), 4)
	}
	lp := lostAfterPay{e: e, c: c, k: k, set: set, cat: cat, released: make(chan struct{}),
		sink: &loseAfterPay{memSink: newMemSink(0), victim: victim.Serial}}
	lp.sink.records = records
	lp.sink.after = func() {
		was.restore(t)
		sw, err := reaper.New(e.shards, e.cat, nil, reaper.Config{}).Sweep(context.Background())
		if err != nil || sw.Released != 2 {
			t.Errorf("sweep = %+v, %v; want the 2 grants released", sw, err)
		}
		close(lp.released)
	}
	return lp
}

// TestAWorkerThatDidNotPayAsksTheSink: two grants alone in their entries
// (--outbox packed) are paid by worker a, and the acknowledgment of their
// entries is lost, beyond go-redis's retries. The shard then loses the
// confirms and the reaper releases the grants, and a stops (a process
// restarted). Worker b, which remembers nothing of a's payouts, takes the
// entries over and finds the grants released: it settles them unpaid in
// the sink (settle.RecordsUnpaid), which answers that it paid them, so b
// leaves the entries for an operator. Taken for released unpaid and
// acknowledged, the amounts paid would be back in the stock, to be
// granted and paid again, with nothing left pending to say so.
func TestAWorkerThatDidNotPayAsksTheSink(t *testing.T) {
	lp := newLostAfterPay(t, true)
	e, ctx, c, k, sink := lp.e, context.Background(), lp.c, lp.k, lp.sink
	a := settle.New(lp.set, lp.cat, sink, fastConfig("a"))
	stopA := run(t, a)
	<-lp.released
	waittest.Until(t, 10*time.Second, "a's acknowledgment lost", func() bool {
		st := a.Stats()
		return st.Delivered == 2 && st.Failures >= 2
	})
	stopA()
	b := settle.New(e.shards, e.cat, sink, fastConfig("b"))
	stopB := run(t, b)
	waittest.Until(t, 20*time.Second, "the entries left for an operator by b", func() bool {
		st := b.Stats()
		return st.Conflicts == 2 && st.LeftForOperator == 2
	})
	time.Sleep(time.Second) // passes over the entries waiting
	stopB()
	sink.mu.Lock()
	for serial, n := range sink.unpaidCalls {
		if n > 1 {
			t.Errorf("the sink was asked %d times to settle serial %d unpaid; want once: b remembers the answer that it paid it", n, serial)
		}
	}
	sink.mu.Unlock()
	if st := b.Stats(); st.Delivered != 0 || st.Expired != 0 || st.Anomalies != 0 {
		t.Fatalf("b's stats %+v: want nothing delivered, none taken for released unpaid", st)
	}
	if paid, again := sink.stats(); paid != 2 || again != 0 || len(sink.unpaid) != 0 {
		t.Fatalf("the sink paid %d grants, %d again, and holds %d settled unpaid; want 2, none again, none unpaid", paid, again, len(sink.unpaid))
	}
	if left, err := c.XLen(ctx, k.Outbox).Result(); err != nil || left != 2 {
		t.Fatalf("outbox = %d entries, %v; want the 2 still there", left, err)
	}
}

// TestAGrantRecordedUnpaidIsNotPaid: the sink holds the victim's serial
// as settled unpaid (a worker found it released), and its shard holds it
// held again (a failover took the release back). The worker confirms it
// but does not pay it: it leaves the entry for an operator, and pays the
// other grant. Once the operator deletes the record (the runbook), the
// next pass pays the victim.
func TestAGrantRecordedUnpaidIsNotPaid(t *testing.T) {
	e, _ := formEnv(t, lua.OutboxPacked, 2, 1, 2, 0)
	ctx := context.Background()
	c, k, entries := e.outbox(t, 2)
	victim := grantsOf(t, entries[0], 1)[0]
	sink := newMemSink(0)
	sink.records = true
	sink.unpaid[victim.Serial] = settle.Grant{Serial: victim.Serial, PoolID: "p", UserID: victim.User, AmountCents: victim.Amount, Unpaid: settle.Released}
	w := settle.New(e.shards, e.cat, sink, fastConfig("a"))
	stop := run(t, w)
	defer stop()
	waittest.Until(t, 20*time.Second, "the other grant paid, the victim's entry left for an operator", func() bool {
		st := w.Stats()
		return st.Delivered == 1 && st.Conflicts == 1 && st.LeftForOperator == 1
	})
	sink.mu.Lock()
	_, paid := sink.paid[victim.Serial]
	delete(sink.unpaid, victim.Serial)
	sink.mu.Unlock()
	if paid {
		t.Fatal("the victim, recorded as settled unpaid, was paid")
	}
	waittest.Until(t, 20*time.Second, "the victim paid once its record is gone, and the outbox empty", func() bool {
		n, err := c.XLen(ctx, k.Outbox).Result()
		return w.Stats().Delivered == 2 && err == nil && n == 0
	})
	if paid, again := sink.stats(); paid != 2 {
		t.Fatalf("the sink paid %d grants (%d again), want 2", paid, again)
	}
}

// TestADamagedGrantHoldsUpNoOtherOfItsEntry: an entry of a batch's grants
// (--outbox batch) holds, beside its three grants, two of 0 cents of one
// serial (a damaged entry: no grant has that). The three are paid; the
// damaged ones go to no sink, each is counted once (Stats.Conflicts), and
// the entry is left pending for an operator.
func TestADamagedGrantHoldsUpNoOtherOfItsEntry(t *testing.T) {
	e, _ := batchEnv(t, 3, 1, 3, 0)
	ctx := context.Background()
	c, k, entries := e.outbox(t, 1)
	es := grantsOf(t, entries[0], 3)
	// Two damaged grants of one serial: each is counted.
	damaged := fmt.Sprintf("%s 0:%d:%d:mallory 0:%d:%d:trudy", entries[0].Values["G"], es[0].Serial+100, es[0].DeadlineMS, es[0].Serial+100, es[0].DeadlineMS)
	if err := c.XDel(ctx, k.Outbox, entries[0].ID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: k.Outbox, Values: []any{"G", damaged}}).Err(); err != nil {
		t.Fatal(err)
	}
	sink := newMemSink(0)
	sink.records = true
	w := settle.New(e.shards, e.cat, sink, fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "the three grants paid, the entry left for an operator", func() bool {
		st := w.Stats()
		return st.Delivered == 3 && st.Conflicts == 2 && st.LeftForOperator == 1
	})
	time.Sleep(500 * time.Millisecond) // passes over the entry left pending
	stop()
	if st := w.Stats(); st.Conflicts != 2 {
		t.Fatalf("stats %+v after more passes: want the 2 damaged grants counted once each", st)
	}
	if paid, again := sink.stats(); paid != 3 || again != 0 || len(sink.unpaid) != 0 {
		t.Fatalf("the sink paid %d grants, %d again, and holds %d settled unpaid; want the 3 once, none unpaid", paid, again, len(sink.unpaid))
	}
	if n, err := c.XLen(ctx, k.Outbox).Result(); err != nil || n != 1 {
		t.Fatalf("outbox = %d entries, %v; want the damaged one still there", n, err)
	}
}

// waitPaidAndMarked waits until s paid serial and w marked one grant.
func (s *memSink) waitPaidAndMarked(t *testing.T, w *settle.Worker, serial int64) {
	t.Helper()
	waittest.Until(t, 10*time.Second, "the victim paid and marked", func() bool {
		s.mu.Lock()
		_, paid := s.paid[serial]
		s.mu.Unlock()
		return paid && settle.Marked(w) == 1
	})
}

// TestAMarkOutlivesATakeover: worker a pays the victim of an entry of two
// grants; its sibling's delivery keeps failing, so the entry stays pending.
// Another consumer takes the entry over (and then stops), and a's passes go
// on meanwhile: the entry is still in the outbox, so a keeps its mark of the
// victim. The shard then loses the victim's confirm, the reaper releases
// it, and a takes the entry back: it leaves it for an operator. Had it
// forgotten the victim was paid, it would take it for released unpaid and
// acknowledge the entry, the amount it paid back in the stock.
func TestAMarkOutlivesATakeover(t *testing.T) {
	pe := newPair(t)
	e, c, k, entries, victim, sibling, was := pe.env, pe.c, pe.k, pe.entries, pe.victim, pe.sibling, pe.was
	ctx := context.Background()
	sink := newMemSink(0)
	sink.fail[sibling.Serial] = true
	cfg := fastConfig("a")
	cfg.ClaimAfter = 6 * time.Second // the entry stays with the other consumer that long
	w := settle.New(e.shards, e.cat, sink, cfg)
	stop := run(t, w)
	sink.waitPaidAndMarked(t, w, victim.Serial)
	if err := c.XClaim(ctx, &redis.XClaimArgs{Stream: k.Outbox, Group: "settle", Consumer: "b",
		Messages: []string{entries[0].ID}}).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a's passes, and a look at its marks, while b holds the entry
	if n := settle.Marked(w); n != 1 {
		t.Fatalf("%d grants marked while another consumer holds the entry, want the victim", n)
	}
	was.restore(t)
	if sw, err := reaper.New(e.shards, e.cat, nil, reaper.Config{}).Sweep(ctx); err != nil || sw.Released != 2 {
		t.Fatalf("sweep = %+v, %v; want the 2 grants released", sw, err)
	}
	waittest.Until(t, 20*time.Second, "the entry left for an operator", func() bool {
		st := w.Stats()
		return st.Conflicts == 1 && st.LeftForOperator == 1
	})
	stop()
	if st := w.Stats(); st.Expired != 1 {
		t.Fatalf("stats %+v: want only the sibling taken for released unpaid", st)
	}
	if n, err := c.XLen(ctx, k.Outbox).Result(); err != nil || n != 1 {
		t.Fatalf("outbox = %d entries, %v; want the entry still there", n, err)
	}
}

// TestMarksLeaveWithTheirPool: worker a pays the victim of an entry of two
// grants, its sibling's delivery failing, and marks it. The pool is then no
// longer listed (its record unreadable for now): a keeps its mark while the
// entry is there, and forgets it once the entry is acknowledged and deleted
// elsewhere (another worker took it over and settled it).
func TestMarksLeaveWithTheirPool(t *testing.T) {
	e, _ := batchEnv(t, 2, 1, 2, 0)
	ctx := context.Background()
	c, k, entries := e.outbox(t, 1)
	es := grantsOf(t, entries[0], 2)
	sink := newMemSink(0)
	sink.fail[es[1].Serial] = true
	subs := &hiding{inner: e.cat}
	w := settle.New(e.shards, subs, sink, fastConfig("a"))
	stop := run(t, w)
	defer stop()
	sink.waitPaidAndMarked(t, w, es[0].Serial)
	subs.hide.Store(true)
	time.Sleep(1500 * time.Millisecond) // listings, and a look at the marks of the outbox no longer listed
	if n := settle.Marked(w); n != 1 {
		t.Fatalf("%d grants marked while the entry is there, want the victim", n)
	}
	if err := lua.Acknowledge(ctx, c, k.Outbox, "settle", []string{entries[0].ID}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 10*time.Second, "nothing marked", func() bool { return settle.Marked(w) == 0 })
}

// hiding is a SubPools that lists none once hide is set.
type hiding struct {
	inner settle.SubPools
	hide  atomic.Bool
}

func (h *hiding) SubPools(ctx context.Context) ([]rain.SubPoolRef, error) {
	if h.hide.Load() {
		return nil, nil
	}
	return h.inner.SubPools(ctx)
}

// outbox is the client and keys of e's first sub-pool, and the entries of
// its outbox, which must be n.
func (e *env) outbox(t *testing.T, n int) (redis.UniversalClient, rain.Keys, []redis.XMessage) {
	t.Helper()
	ctx := context.Background()
	subs, err := e.cat.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, k := e.shards.Client(subs[0].Shard), subs[0].Keys()
	entries, err := c.XRange(ctx, k.Outbox, "-", "+").Result()
	if err != nil || len(entries) != n {
		t.Fatalf("outbox = %d entries, %v; want %d", len(entries), err, n)
	}
	return c, k, entries
}

// grantsOf reads entry m, which must hold n grants.
func grantsOf(t *testing.T, m redis.XMessage, n int) []lua.OutboxEntry {
	t.Helper()
	es, err := lua.ParseOutboxEntries(m.Values)
	if err != nil || len(es) != n {
		t.Fatalf("entry %s = %+v, %v; want %d grants", m.ID, es, err, n)
	}
	return es
}

// TestAnAcknowledgmentLostMidRead: a read of four entries of ten grants in
// parts of five (under --outbox packed, reads of entries of one grant
// each); the acknowledgment after the second part never runs, or runs with
// its reply lost, four times over (beyond go-redis's retries). The later
// parts go on; every grant is paid, none delivered twice or counted
// delivered twice, every entry acknowledged in the end, and the failure
// counted.
func TestAnAcknowledgmentLostMidRead(t *testing.T) {
	for _, tc := range []struct {
		form lua.OutboxForm
		lost string
	}{{lua.OutboxBatch, "request"}, {lua.OutboxBatch, "reply"}, {lua.OutboxPacked, "request"}, {lua.OutboxPacked, "reply"}} {
		lost := tc.lost
		t.Run(tc.form.String()+"/"+lost, func(t *testing.T) {
			e, grants := formEnv(t, tc.form, 40, 1, 10, 0)
			set, cat, proxies, _ := e.doomed(t)
			for _, p := range proxies {
				if lost == "request" {
					p.DropRequests(redisproxy.Script(lua.SHA("acknowledge")), 4)
				} else {
					p.DropReplies(redisproxy.Script(lua.SHA("acknowledge")), 4)
				}
			}
			sink := newMemSink(0)
			w := settle.New(set, cat, sink, fastConfig("a"))
			stop := run(t, w)
			waittest.Until(t, 20*time.Second, "every entry acknowledged", func() bool { return e.outboxed(t) == 0 && pending(t, e) == 0 })
			// An acknowledgment whose reply was lost applied: what the worker
			// marked of its entries leaves once it finds them gone.
			waittest.Until(t, 10*time.Second, "nothing marked", func() bool { return settle.Marked(w) == 0 })
			stop()
			sink.checkPaidOnce(t, w, grants)
			if n := e.confirmed(t); n != 40 {
				t.Fatalf("%d grants confirmed, want 40", n)
			}
			e.assertAudit(t)
		})
	}
}
