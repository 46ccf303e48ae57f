package settle_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/lua"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/wait/waittest"
)

// batchEnv preloads pool "p" of count packets in subs sub-pools and grants
// them all in claim_many scripts of per claims each, as rain serve
// --outbox batch makes them under load: outbox entries of per grants. It
// returns the grants by serial.
func batchEnv(t *testing.T, count, subs, per int, hold int64) (*env, map[int64]grab.Result) {
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
	form := lua.Form{Outbox: lua.OutboxBatch, BatchedDeadlines: true}
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
	subs, err := e.cat.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, key := e.shards.Client(subs[0].Shard), subs[0].Keys().Outbox
	entries, err := c.XRange(ctx, key, "-", "+").Result()
	if err != nil || len(entries) != 4 {
		t.Fatalf("outbox = %d entries, %v; want 4 of 10 grants", len(entries), err)
	}
	es, err := lua.ParseOutboxEntries(entries[1].Values)
	if err != nil || len(es) != 10 {
		t.Fatalf("entry %v = %+v, %v; want 10 grants", entries[1].Values, es, err)
	}
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
