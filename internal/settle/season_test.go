package settle_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/wait/waittest"
)

// grabAll has n new users (prefix-numbered) grab pool id, and returns the
// grants by serial.
func grabAll(t *testing.T, svc *grab.Service, id, prefix string, n int) map[int64]grab.Result {
	t.Helper()
	out := map[int64]grab.Result{}
	for u := range n {
		// An outcome not known yet (on a busy machine, no replica confirmed
		// the batch within its WAIT) is retried, as a client does: the
		// retry answers the grant, if one was made, as already granted.
		var r grab.Result
		var err error
		try := 0
		for ; ; try++ {
			r, err = svc.Grab(context.Background(), id, fmt.Sprintf("%s%d", prefix, u))
			if !errors.Is(err, grab.ErrOutcomeUnknown) || try == 10 {
				break
			}
			t.Logf("grab of %s by %s%d: %v; retried", id, prefix, u, err)
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil || r.Outcome != grab.Granted && (try == 0 || r.Outcome != grab.AlreadyGranted) {
			t.Fatalf("grab of %s by %s%d = %+v, %v; want granted", id, prefix, u, r, err)
		}
		out[r.Serial] = r
	}
	return out
}

// TestOneWorkerThroughASeason: one settle worker, started first and left
// running as rain settle is deployed, settles pool B's grants made after
// pool A (on the same shards) closed, and those of a pool C preloaded after
// that close: one pool's close never stalls another's settlement
// (invariant 11). The worker keeps its own view of the pools, as a process
// of its own does, and hears of A's close from nobody; it creates no key of
// the closed pool.
func TestOneWorkerThroughASeason(t *testing.T) {
	ctx := context.Background()
	ge := grabtest.Start(t, 2, redistest.Options{})
	cat, svc := ge.Catalog, ge.Service
	for _, id := range []string{"a", "b"} {
		if _, _, err := cat.Preload(ctx, rain.Spec{PoolID: id, TotalCents: 100_000, Count: 1000, SubPools: 2}); err != nil {
			t.Fatal(err)
		}
	}
	other := grabtest.On(t, ge.Servers, redistest.Addrs(ge.Servers)) // rain settle's own process
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	w := settle.New(other.Shards, other.Catalog, openLedger(t, path), fastConfig("settle"))
	run(t, w)
	grants := grabAll(t, svc, "a", "a", 20)
	for s, r := range grabAll(t, svc, "b", "b", 20) {
		grants[s] = r
	}
	waittest.Until(t, 20*time.Second, "the grants of a and b delivered", func() bool { return w.Stats().Delivered == 40 })
	if _, err := cat.End(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	var a *rain.Account
	waittest.Until(t, 20*time.Second, "pool a closes", func() bool {
		var err error
		a, err = cat.Close(ctx, "a")
		return err == nil
	})
	if a.ConfirmedCount != 20 {
		t.Fatalf("a's account %+v; want 20 confirmed", a)
	}
	for s, r := range grabAll(t, svc, "b", "late", 20) {
		grants[s] = r
	}
	if _, _, err := cat.Preload(ctx, rain.Spec{PoolID: "c", TotalCents: 100_000, Count: 1000, SubPools: 2}); err != nil {
		t.Fatal(err)
	}
	for s, r := range grabAll(t, svc, "c", "c", 20) {
		grants[s] = r
	}
	waittest.Until(t, 20*time.Second, "every grant of b and c, made after a's close, delivered", func() bool {
		return w.Stats().Delivered == 80
	})
	for _, id := range []string{"b", "c"} {
		st, err := cat.Status(ctx, id)
		if err != nil || st.HeldCount != 0 {
			t.Fatalf("status of %s = %+v, %v; want nothing held", id, st, err)
		}
	}
	waittest.Until(t, 10*time.Second, "the lag back to 0", func() bool { return w.Stats().Lag == 0 })
	checkLedger(t, path, grants)
	for i, c := range ge.Clients {
		keys, err := c.Keys(ctx, "rain:{a:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if !strings.HasSuffix(k, ":meta") {
				t.Errorf("shard s%d holds %s of the closed pool a: settlement made it again", i+1, k)
			}
		}
	}
}

// TestSettlementThatCannotReadSaysSo: a worker that cannot read a shard's
// outboxes counts each failed read, and its lag grows from the last pass
// that read them all, though nothing new could be seen there: the alerts on
// failures and lag fire for a settlement that cannot progress. When the
// shard is back the lag returns to 0.
func TestSettlementThatCannotReadSaysSo(t *testing.T) {
	e, _ := newEnv(t, 10, 0)
	set, cat, proxies, _ := e.doomed(t)
	w := settle.New(set, cat, openLedger(t, filepath.Join(t.TempDir(), "ledger.jsonl")), fastConfig("a"))
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant delivered", func() bool { return w.Stats().Delivered == 10 })
	before := w.Stats().Failures
	proxies[1].Partition()
	waittest.Until(t, 20*time.Second, "the failed reads counted and the lag past 2s", func() bool {
		st := w.Stats()
		return st.Failures > before+2 && st.Lag > 2*time.Second
	})
	proxies[1].Heal()
	waittest.Until(t, 20*time.Second, "the lag back to 0 once the shard is read again", func() bool { return w.Stats().Lag == 0 })
}

// TestConfirmWaitsForAReplica: on a shard with replicas (Sentinel) nothing
// is paid until a replica holds the confirm: with its replica frozen the
// worker delivers nothing, counts the failed waits and leaves every entry
// pending; thawed, it pays each grant once. (A confirm a failover lost
// would let the reaper release a grant already paid, and grant it again.)
func TestConfirmWaitsForAReplica(t *testing.T) {
	ctx := context.Background()
	rs := redistest.StartReplicated(t) // its Sentinel never fails it over here
	primary, replica := rs.Primary, rs.Replica
	plain := redistest.Start(t, redistest.Options{AOF: true, Fsync: "always"})
	ge := grabtest.On(t, []*redistest.Server{primary, plain}, []string{rs.Spec(), plain.Addr})
	id := ""
	for i := 0; id == ""; i++ { // a pool of one sub-pool, on the Sentinel shard s1
		if c := fmt.Sprintf("ha%d", i); ge.Shards.Ring().Distinct(c, 1)[0] == "s1" {
			id = c
		}
	}
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: id, TotalCents: 1_000, Count: 10, SubPools: 1}); err != nil {
		t.Fatal(err)
	}
	grants := grabAll(t, ge.Service, id, "u", 5)
	replica.Pause()
	t.Cleanup(replica.Resume)
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	w := settle.New(ge.Shards, ge.Catalog, openLedger(t, path), fastConfig("settle"))
	run(t, w)
	waittest.Until(t, 20*time.Second, "confirms that no replica acknowledged counted as failures, or a payout", func() bool {
		st := w.Stats()
		return st.Failures >= 3 || st.Delivered > 0
	})
	if st := w.Stats(); st.Delivered != 0 {
		t.Fatalf("%d grants paid while no replica held their confirm; want none", st.Delivered)
	}
	replica.Resume()
	waittest.Until(t, 20*time.Second, "every grant paid once the replica is back", func() bool { return w.Stats().Delivered == 5 })
	checkLedger(t, path, grants)
}

// TestAcknowledgedMeansTrimmed: settlement acknowledges an entry and
// deletes it from its outbox in one step. A worker whose every XDEL is lost
// (as a process that dies between the two commands, again and again)
// leaves no entry acknowledged and still in the outbox, where no worker
// would read it again and it would keep the pool from closing for good:
// the outboxes empty, and the pool closes.
func TestAcknowledgedMeansTrimmed(t *testing.T) {
	ctx := context.Background()
	e, grants := newEnv(t, 10, 0)
	set, cat, proxies, _ := e.doomed(t)
	for _, p := range proxies {
		p.DropRequests(redisproxy.Command("XDEL"), 1<<20)
	}
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	stop := run(t, settle.New(set, cat, l, fastConfig("a")))
	waittest.Until(t, 20*time.Second, "every grant confirmed", func() bool { return e.confirmed(t) == 10 })
	stop()
	run(t, settle.New(e.shards, e.cat, l, fastConfig("b"))) // the next worker, straight to the shards
	waittest.Until(t, 20*time.Second, "every outbox empty", func() bool { return e.outboxed(t) == 0 })
	if _, err := e.cat.End(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cat.Close(ctx, "p"); err != nil {
		t.Fatalf("close = %v", err)
	}
	checkLedger(t, path, grants)
}

// TestIdleWorkerCountsNoFailure: a worker over two pools (two outboxes a
// shard), once every grant is settled and nothing new comes, counts no
// failure and shows no lag (a read that waited and found nothing is no
// error), and settles a grant made then within its read's block, not
// after a backoff.
func TestIdleWorkerCountsNoFailure(t *testing.T) {
	ctx := context.Background()
	ge := grabtest.Start(t, 2, redistest.Options{})
	for _, id := range []string{"a", "b"} {
		if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: id, TotalCents: 100_000, Count: 1000, SubPools: 2}); err != nil {
			t.Fatal(err)
		}
	}
	grabAll(t, ge.Service, "a", "a", 10)
	grabAll(t, ge.Service, "b", "b", 10)
	cfg := fastConfig("settle")
	cfg.Block = 200 * time.Millisecond
	cfg.RetryDelay, cfg.MaxRetryDelay = time.Minute, time.Minute // a pass that failed would outlast the wait below
	w := settle.New(ge.Shards, ge.Catalog, openLedger(t, filepath.Join(t.TempDir(), "ledger.jsonl")), cfg)
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant delivered", func() bool { return w.Stats().Delivered == 20 })
	before := w.Stats()
	time.Sleep(2 * time.Second) // idle: reads that find nothing
	if after := w.Stats(); after.Failures != before.Failures || after.Lag != 0 {
		t.Fatalf("an idle worker counted %d failures and shows a lag of %v; want none", after.Failures-before.Failures, after.Lag)
	}
	grabAll(t, ge.Service, "a", "late", 1)
	waittest.Until(t, 30*time.Second, "the late grant delivered, not after a backoff (a minute)", func() bool { return w.Stats().Delivered == 21 })
}

// TestWorkerWithoutAShardSaysSo: a worker given fewer shards than a pool
// was placed on (a shard added to rain serve's ring before rain settle was
// restarted with it) cannot read that shard's outboxes: it says so in its
// failures, and settles the sub-pools on the shards it has.
func TestWorkerWithoutAShardSaysSo(t *testing.T) {
	ctx := context.Background()
	ge := grabtest.Start(t, 3, redistest.Options{})
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: "p", TotalCents: 30_000, Count: 300, SubPools: 3}); err != nil {
		t.Fatal(err)
	}
	grabAll(t, ge.Service, "p", "u", 30)
	short := grabtest.On(t, ge.Servers[:2], redistest.Addrs(ge.Servers[:2])) // rain settle without s3
	w := settle.New(short.Shards, short.Catalog, openLedger(t, filepath.Join(t.TempDir(), "ledger.jsonl")), fastConfig("settle"))
	run(t, w)
	waittest.Until(t, 20*time.Second, "the worker counts the shard it lacks as failures, and settles the others", func() bool {
		st, err := ge.Catalog.Status(ctx, "p")
		return err == nil && w.Stats().Failures > 0 && st.ConfirmedCount > 0 && st.HeldCount > 0
	})
}
