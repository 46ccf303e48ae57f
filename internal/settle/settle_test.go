package settle_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"rain"
	"rain/internal/catalog"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/ledger"
	"rain/internal/lua"
	"rain/internal/reaper"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
	"rain/internal/webhook"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.IgnoreProbe()) }

type env struct {
	servers []*redistest.Server
	shards  *shard.Set
	cat     *catalog.Catalog
	svc     *grab.Service
}

// newEnv preloads pool "p" (count packets, 2 sub-pools on 2 shards) and
// grabs them all; it returns the grants by serial.
func newEnv(t *testing.T, count int, hold int64) (*env, map[int64]grab.Result) {
	t.Helper()
	ge := grabtest.Start(t, 2, redistest.Options{})
	set, svc, cat := ge.Shards, ge.Service, ge.Catalog
	ctx := context.Background()
	if _, _, err := cat.Preload(ctx, rain.Spec{PoolID: "p", TotalCents: int64(count) * 100, Count: int64(count), SubPools: 2, HoldSeconds: hold}); err != nil {
		t.Fatal(err)
	}
	grants := map[int64]grab.Result{}
	for u := 0; len(grants) < count; u++ {
		r, err := svc.Grab(ctx, "p", fmt.Sprintf("u%d", u))
		if err != nil {
			t.Fatal(err)
		}
		if r.Outcome == grab.Granted {
			grants[r.Serial] = r
		}
		if u > 100*count {
			t.Fatalf("only %d of %d packets granted", len(grants), count)
		}
	}
	return &env{servers: ge.Servers, shards: set, cat: cat, svc: svc}, grants
}

// run starts a worker until the returned stop is called, which waits for
// Run to return.
func run(t *testing.T, w *settle.Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func (e *env) confirmed(t *testing.T) int64 {
	t.Helper()
	st, err := e.cat.Status(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	return st.ConfirmedCount
}

func (e *env) assertAudit(t *testing.T) {
	t.Helper()
	r, err := e.cat.Audit(context.Background(), "p")
	if err != nil || !r.OK {
		t.Fatalf("audit = %+v, %v", r, err)
	}
}

// readLedger reads the ledger's grants by serial (one line per serial).
func readLedger(t *testing.T, path string) map[int64]settle.Grant {
	t.Helper()
	grants, err := ledger.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return grants
}

func checkLedger(t *testing.T, path string, grants map[int64]grab.Result) {
	t.Helper()
	lines := readLedger(t, path)
	if len(lines) != len(grants) {
		t.Fatalf("ledger has %d lines, want one per grant: %d", len(lines), len(grants))
	}
	for serial, r := range grants {
		if lines[serial].AmountCents != r.Amount {
			t.Fatalf("ledger line of serial %d = %+v, want amount %d", serial, lines[serial], r.Amount)
		}
	}
}

// openLedger opens the ledger at path, closed when the test ends (a test
// may close it earlier, as a crash would, and open it again).
func openLedger(t *testing.T, path string) *ledger.File {
	t.Helper()
	l, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// doomed is a worker's view of the shards through proxies: cut (by
// partition, or by the returned function) it is a process that died.
func (e *env) doomed(t *testing.T) (set *shard.Set, cat *catalog.Catalog, proxies []*redisproxy.Proxy, die func()) {
	t.Helper()
	addrs := make([]string, len(e.servers))
	for _, srv := range e.servers {
		p := redisproxy.Start(t, srv.Addr)
		proxies = append(proxies, p)
		addrs = append(addrs, p.Addr)
	}
	addrs = addrs[len(e.servers):]
	ge := grabtest.On(t, e.servers, addrs)
	die = func() {
		for _, p := range proxies {
			p.Partition()
		}
	}
	return ge.Shards, ge.Catalog, proxies, die
}

// dying is a sink that calls die once it has delivered at least at grants:
// the process dies after a payout, before its ack.
type dying struct {
	settle.Sink
	n   atomic.Int32
	at  int32
	die func()

	mu      sync.Mutex
	paid    []int64 // the serials delivered
	atDeath []int64 // paid when it died
}

func (d *dying) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := d.Sink.Deliver(ctx, gs)
	d.mu.Lock()
	for i, g := range gs {
		if errs[i] == nil {
			d.paid = append(d.paid, g.Serial)
		}
	}
	if n := d.n.Add(int32(len(gs))); n >= d.at && n-int32(len(gs)) < d.at {
		d.atDeath = slices.Clone(d.paid)
		d.die()
	}
	d.mu.Unlock()
	return errs
}

// deliverOne delivers one grant to s.
func deliverOne(ctx context.Context, s settle.Sink, g settle.Grant) error {
	return s.Deliver(ctx, []settle.Grant{g})[0]
}

func fastConfig(consumer string) settle.Config {
	return settle.Config{Consumer: consumer, Batch: 5, Block: 50 * time.Millisecond, Refresh: 50 * time.Millisecond,
		ClaimAfter: 200 * time.Millisecond, RetryDelay: 20 * time.Millisecond}
}

func TestSettleToLedger(t *testing.T) {
	e, grants := newEnv(t, 100, 0)
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	w := settle.New(e.shards, e.cat, l, fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "all grants confirmed", func() bool { return e.confirmed(t) == 100 })
	waittest.Until(t, 20*time.Second, "all delivered", func() bool { return w.Stats().Delivered == 100 })
	// Settled entries are trimmed: each outbox holds what is unsettled.
	waittest.Until(t, 20*time.Second, "every outbox empty", func() bool { return e.outboxed(t) == 0 })
	stop()
	checkLedger(t, path, grants)
	e.assertAudit(t)
}

// outboxed counts the entries left in every outbox.
func (e *env) outboxed(t *testing.T) int64 {
	t.Helper()
	return e.sumOutboxes(t, func(ctx context.Context, c redis.UniversalClient, key string) (int64, error) {
		return c.XLen(ctx, key).Result()
	})
}

// sumOutboxes sums count over the outbox of every sub-pool.
func (e *env) sumOutboxes(t *testing.T, count func(ctx context.Context, c redis.UniversalClient, key string) (int64, error)) int64 {
	t.Helper()
	ctx := context.Background()
	subs, err := e.cat.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sp := range subs {
		v, err := count(ctx, e.shards.Client(sp.Shard), sp.Keys().Outbox)
		if err != nil {
			t.Fatal(err)
		}
		n += v
	}
	return n
}

// TestCrashAtEveryStep: a worker dies (it is cut off from every shard: a
// partition, which to the shards is a process that died) right after its
// second batch of confirms ran (its reply lost), or right after its tenth
// delivery (before its ack), on entries of one grant each or of ten (under
// --outbox batch: mid-entry); a second worker takes the pending entries
// over. Exactly one ledger line per serial, every grant confirmed, every
// entry acknowledged.
func TestCrashAtEveryStep(t *testing.T) {
	for _, c := range []struct {
		step string
		per  int // grants an entry
	}{{"confirmed", 1}, {"delivered", 1}, {"confirmed", 10}, {"delivered", 10}} {
		t.Run(fmt.Sprintf("%s/per=%d", c.step, c.per), func(t *testing.T) {
			step := c.step
			var e *env
			var grants map[int64]grab.Result
			if c.per == 1 {
				e, grants = newEnv(t, 60, 0)
			} else {
				e, grants = batchEnv(t, 60, 2, c.per, 0)
			}
			path := filepath.Join(t.TempDir(), "ledger.jsonl")
			l := openLedger(t, path)
			set, cat, proxies, die := e.doomed(t)
			var sink settle.Sink = l
			var dies *dying
			if step == "confirmed" {
				for _, p := range proxies {
					p.PartitionAfter(redisproxy.Script(lua.SHA("confirm_many")), 2, die)
				}
			} else {
				// Entries of 10 go in parts of 5 (Batch), two outboxes at
				// once: at 15 grants paid, some entry is paid in part
				// whichever outboxes the parts were of (mid-entry).
				dies = &dying{Sink: l, at: 10, die: die}
				if c.per > 1 {
					dies.at = 15
				}
				sink = dies
			}
			first := settle.New(set, cat, sink, fastConfig("first"))
			stopFirst := run(t, first)
			waittest.Until(t, 20*time.Second, "the first worker cut off", func() bool { return proxies[0].Partitioned() })
			stopFirst()
			l.Close()
			if e.confirmed(t) == 60 && e.outboxed(t) == 0 {
				t.Fatal("the first worker settled everything before its crash: the test proves nothing")
			}
			if dies != nil && c.per > 1 {
				dies.mu.Lock()
				partly := entriesPaidInPart(dies.atDeath, c.per)
				dies.mu.Unlock()
				if partly == 0 {
					t.Fatal("no entry was paid in part when the first worker died: the crash did not come mid-entry")
				}
			}

			// The process restarts: the ledger is read again, another consumer takes over.
			l2 := openLedger(t, path)
			second := settle.New(e.shards, e.cat, l2, fastConfig("second"))
			stop := run(t, second)
			waittest.Until(t, 20*time.Second, "all grants confirmed", func() bool { return e.confirmed(t) == 60 })
			waittest.Until(t, 20*time.Second, "every entry acknowledged", func() bool { return pending(t, e) == 0 && e.outboxed(t) == 0 })
			stop()
			checkLedger(t, path, grants)
			e.assertAudit(t)
		})
	}
}

// entriesPaidInPart counts the entries of per grants of batchEnv (serials
// in blocks of per from 1<<40+1) of which some but not all of paid are.
func entriesPaidInPart(paid []int64, per int) int {
	in := map[int64]int{}
	for _, s := range paid {
		in[(s-(1<<40)-1)/int64(per)]++
	}
	n := 0
	for _, k := range in {
		if k < per {
			n++
		}
	}
	return n
}

// pending counts entries pending in the settle group on every outbox.
func pending(t *testing.T, e *env) int64 {
	t.Helper()
	return e.sumOutboxes(t, func(ctx context.Context, c redis.UniversalClient, key string) (int64, error) {
		p, err := c.XPending(ctx, key, "settle").Result()
		if err != nil {
			return 0, err
		}
		return p.Count, nil
	})
}

// TestWebhookRetriesAndDedupes: the wallet fails the first two tries of each
// grant; settlement retries; the wallet sees every serial, and pays once.
func TestWebhookRetriesAndDedupes(t *testing.T) {
	e, grants := newEnv(t, 30, 0)
	var mu sync.Mutex
	tries := map[string]int{}
	paid := map[int64]int64{}
	wallet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		var g settle.Grant
		if err := json.NewDecoder(r.Body).Decode(&g); err != nil || key != fmt.Sprint(g.Serial) {
			http.Error(w, "bad request", 400)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if tries[key]++; tries[key] <= 2 {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		if _, ok := paid[g.Serial]; !ok {
			paid[g.Serial] = g.AmountCents
		}
	}))
	defer wallet.Close()
	w := settle.New(e.shards, e.cat, &webhook.Wallet{URL: wallet.URL, Backoff: time.Millisecond, Tries: 5}, fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "all grants confirmed and paid", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(paid) == 30 && e.confirmed(t) == 30
	})
	stop()
	for serial, r := range grants {
		if paid[serial] != r.Amount {
			t.Fatalf("wallet paid %d for serial %d, want %d", paid[serial], serial, r.Amount)
		}
	}
	e.assertAudit(t)
}

// TestReleasedGrantIsNotPaid: a grant released at its deadline before
// settlement saw it is acknowledged, not delivered.
func TestReleasedGrantIsNotPaid(t *testing.T) {
	e, _ := newEnv(t, 20, 1)
	checkReleasedNotPaid(t, e, 20)
}

// releaseDue sweeps e's shards as the reaper does until n grants are
// released at their deadline.
func (e *env) releaseDue(t *testing.T, n int64) {
	t.Helper()
	reap := reaper.New(e.shards, e.cat, nil, reaper.Config{})
	var released int64
	waittest.Until(t, 10*time.Second, fmt.Sprintf("%d grants released at their deadline", n), func() bool {
		sw, err := reap.Sweep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		released += sw.Released
		return released == n
	})
}

// checkReleasedNotPaid has the reaper release the n grants of e (their
// hold runs out), then settles: none is paid, and every entry is
// acknowledged and trimmed.
func checkReleasedNotPaid(t *testing.T, e *env, n int64) {
	t.Helper()
	e.releaseDue(t, n)
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	w := settle.New(e.shards, e.cat, openLedger(t, path), fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "every entry handled", func() bool {
		return w.Stats().Expired == n && pending(t, e) == 0 && e.outboxed(t) == 0
	})
	stop()
	if got := readLedger(t, path); len(got) != 0 {
		t.Fatalf("ledger has %d grants paid of the released grants, want none", len(got))
	}
	// Each recorded once as settled unpaid (settle.RecordsUnpaid).
	if b, err := os.ReadFile(path + ledger.UnpaidSuffix); err != nil || strings.Count(string(b), `"unpaid":"released"`) != int(n) || strings.Count(string(b), "\n") != int(n) {
		t.Fatalf("ledger of %d lines, %d released (%v); want the %d released grants, a line each", strings.Count(string(b), "\n"),
			strings.Count(string(b), `"unpaid":"released"`), err, n)
	}
	e.assertAudit(t)
}

// TestSerialConflictIsAnAlarm: the ledger already holds a serial for
// another grant (a serial handed out twice, a shard that lost writes). The
// worker must not skip the entry as "already paid": it counts the conflict
// once, logs it, and leaves the entry pending for an operator, while every
// other grant is paid.
func TestSerialConflictIsAnAlarm(t *testing.T) {
	e, grants := newEnv(t, 10, 0)
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	var victim int64
	for serial := range grants {
		victim = serial
		break
	}
	other := settle.Grant{Serial: victim, PoolID: "elsewhere", UserID: "someone", AmountCents: 1}
	if err := deliverOne(context.Background(), l, other); err != nil {
		t.Fatal(err)
	}
	w := settle.New(e.shards, e.cat, l, fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "the other grants paid", func() bool { return w.Stats().Delivered == 9 && w.Stats().Conflicts == 1 })
	time.Sleep(300 * time.Millisecond) // several passes over the pending entry
	stop()
	if st := w.Stats(); st.Conflicts != 1 || st.Delivered != 9 {
		t.Fatalf("stats %+v, want 9 delivered and the conflict counted once", st)
	}
	if n := pending(t, e); n != 1 {
		t.Fatalf("%d entries pending, want the conflicting one", n)
	}
	if got := readLedger(t, path)[victim]; got != other {
		t.Fatalf("ledger line of serial %d = %+v, want the first grant under it kept: %+v", victim, got, other)
	}
}

// TestTwoWebhookWorkersPayOnce: two settle workers deliver to one wallet;
// the first dies after delivering some grants, before acknowledging them,
// and the second takes its pending entries over and delivers them again.
// The wallet dedupes by the body's serial across workers, as
// docs/security.md says (and answers 409 for a serial it saw with another
// body), so every grant is paid exactly once.
func TestTwoWebhookWorkersPayOnce(t *testing.T) {
	e, grants := newEnv(t, 40, 0)
	var mu sync.Mutex
	deliveries := map[string]int{}
	paid := map[string][]byte{}
	wallet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var g settle.Grant
		if err := json.Unmarshal(body, &g); err != nil || r.Header.Get("Idempotency-Key") != fmt.Sprint(g.Serial) {
			http.Error(w, "not a grant, or a key that is not its serial", http.StatusBadRequest)
			return
		}
		key := fmt.Sprint(g.Serial)
		mu.Lock()
		defer mu.Unlock()
		deliveries[key]++
		if first, ok := paid[key]; ok {
			if !bytes.Equal(first, body) {
				http.Error(w, "key reused for another grant", http.StatusConflict)
			}
			return // paid before: answered again, not paid again
		}
		paid[key] = body
	}))
	defer wallet.Close()
	sink := &webhook.Wallet{URL: wallet.URL, Backoff: time.Millisecond}

	set, cat, proxies, die := e.doomed(t)
	first := settle.New(set, cat, &dying{Sink: sink, at: 5, die: die}, fastConfig("first"))
	stopFirst := run(t, first)
	waittest.Until(t, 20*time.Second, "the first worker dead after a payout", func() bool { return proxies[0].Partitioned() })
	stopFirst()
	second := settle.New(e.shards, e.cat, sink, fastConfig("second"))
	stop := run(t, second)
	waittest.Until(t, 20*time.Second, "every entry acknowledged", func() bool { return e.confirmed(t) == 40 && pending(t, e) == 0 })
	stop()

	mu.Lock()
	defer mu.Unlock()
	again := 0
	for serial, r := range grants {
		key := fmt.Sprint(serial)
		var g settle.Grant
		if err := json.Unmarshal(paid[key], &g); err != nil || g.AmountCents != r.Amount {
			t.Fatalf("wallet paid %s for serial %d, want %d cents", paid[key], serial, r.Amount)
		}
		if deliveries[key] > 1 {
			again++
		}
	}
	if len(paid) != 40 {
		t.Fatalf("wallet paid %d grants, want 40", len(paid))
	}
	if again == 0 {
		t.Fatal("no grant was delivered twice: the takeover was not exercised")
	}
	t.Logf("%d grants delivered by both workers, each paid once", again)
}

// failingSink fails the deliveries of sub-pool 0 while down is set.
type failingSink struct {
	down      atomic.Bool
	mu        sync.Mutex
	delivered map[int]int // by sub-pool
}

func (s *failingSink) Deliver(_ context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, g := range gs {
		if g.SubPool == 0 && s.down.Load() {
			errs[i] = errors.New("wallet down")
			continue
		}
		s.delivered[g.SubPool]++
	}
	return errs
}

// TestLagFollowsTheOldestUnsettled: while the wallet refuses one
// sub-pool's grants, rain_settle_lag_seconds is the age of the oldest of
// them and keeps growing, even though the other sub-pool's outbox is
// settled and its reads come back empty (it used to drop to 0 on any empty
// read); once the wallet takes them, it is 0.
func TestLagFollowsTheOldestUnsettled(t *testing.T) {
	e, _ := newEnv(t, 20, 0)
	written := time.Now() // every grant's outbox entry is older than this
	sink := &failingSink{delivered: map[int]int{}}
	sink.down.Store(true)
	w := settle.New(e.shards, e.cat, sink, fastConfig("a"))
	run(t, w)
	waittest.Until(t, 20*time.Second, "sub-pool 1 settled while sub-pool 0 fails", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.delivered[1] > 0 && w.Stats().Failures > 2 && w.Stats().Lag > 0
	})
	prev := time.Duration(0)
	for range 40 { // 400 ms of passes, empty reads of sub-pool 1 among them
		lag := w.Stats().Lag
		if lag < time.Since(written) || lag < prev {
			t.Fatalf("lag %v (before: %v) while grants written %v ago wait; want at least their age, never falling", lag, prev, time.Since(written))
		}
		prev = lag
		time.Sleep(10 * time.Millisecond)
	}
	sink.down.Store(false)
	waittest.Until(t, 20*time.Second, "all delivered and the lag back to 0", func() bool {
		return w.Stats().Delivered == 20 && w.Stats().Lag == 0
	})
}

// TestEntriesOfBothFormsAreSettled: an outbox written before the scripts
// packed their entries (a field per value) is settled after an upgrade as
// one written now: half of every outbox's grants are rewritten in the
// older form beside the others, and each grant is paid once, at its
// amount, to its pool and sub-pool.
func TestEntriesOfBothFormsAreSettled(t *testing.T) {
	e, grants := newEnv(t, 40, 0)
	ctx := context.Background()
	subs, err := e.cat.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type owner struct {
		user string
		sub  int
	}
	want := map[int64]owner{} // by serial
	rewritten := 0
	for _, sp := range subs {
		c, key := e.shards.Client(sp.Shard), sp.Keys().Outbox
		entries, err := c.XRange(ctx, key, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		for i, en := range entries {
			gs, err := lua.ParseOutboxEntries(en.Values)
			if err != nil || len(gs) != 1 || gs[0].Release {
				t.Fatalf("outbox entry %v = %+v, %v; want one grant (one grab a batch)", en.Values, gs, err)
			}
			g := gs[0]
			want[g.Serial] = owner{g.User, sp.Index}
			if i%2 == 1 {
				continue
			}
			old := []any{"type", "grant", "pool", sp.Pool, "sub", sp.Index, "user", g.User,
				"amount", g.Amount, "serial", g.Serial, "deadline_ms", g.DeadlineMS}
			if err := c.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: old}).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.XDel(ctx, key, en.ID).Err(); err != nil {
				t.Fatal(err)
			}
			rewritten++
		}
	}
	if rewritten < 10 {
		t.Fatalf("%d entries rewritten, want half of 40", rewritten)
	}
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	w := settle.New(e.shards, e.cat, openLedger(t, path), fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "every outbox empty", func() bool { return e.outboxed(t) == 0 })
	stop()
	if st := w.Stats(); st.Delivered != 40 || st.Anomalies != 0 {
		t.Fatalf("stats %+v: want 40 delivered, no anomaly", st)
	}
	checkLedger(t, path, grants)
	for serial, g := range readLedger(t, path) {
		if g.PoolID != "p" || (owner{g.UserID, g.SubPool}) != want[serial] {
			t.Fatalf("ledger line %+v, want user and sub-pool %+v", g, want[serial])
		}
	}
	e.assertAudit(t)
}

// TestUnreadableEntryIsLeftForAnOperator: an outbox entry settlement cannot
// read (a form a later rain writes, a damaged entry) may be a grant: it is
// left pending for an operator, not acknowledged unpaid; an unreadable
// release, which pays nothing, is acknowledged. The grants beside them are
// paid.
func TestUnreadableEntryIsLeftForAnOperator(t *testing.T) {
	e, grants := newEnv(t, 4, 0)
	ctx := context.Background()
	subs, err := e.cat.SubPools(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, key := e.shards.Client(subs[0].Shard), subs[0].Keys().Outbox
	for _, v := range []map[string]any{{"g": "a later form"}, {"r": "damaged"}} {
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	w := settle.New(e.shards, e.cat, openLedger(t, path), fastConfig("a"))
	stop := run(t, w)
	waittest.Until(t, 20*time.Second, "the grants paid, the unreadable grant left", func() bool {
		st := w.Stats()
		return st.Delivered == 4 && st.Conflicts == 1 && st.Anomalies == 1 && e.outboxed(t) == 1 && st.LeftForOperator == 1
	})
	left, err := c.XRange(ctx, key, "-", "+").Result()
	if err != nil || len(left) != 1 || left[0].Values["g"] != "a later form" {
		t.Fatalf("outbox = %v, %v; want the unreadable grant entry alone", left, err)
	}
	// Waiting, it is no lag (RainSettlementConflict says it waits), not even
	// while a pass reads it again: the lag stays below its age, sampled
	// until it is two seconds old.
	var lag time.Duration
	waittest.Until(t, 10*time.Second, "the waiting entry two seconds old", func() bool {
		lag = max(lag, w.Stats().Lag)
		return time.Since(entryTime(t, left[0].ID)) > 2*time.Second
	})
	if lag > time.Second {
		t.Fatalf("settlement lag reached %v while the only entry left waited for an operator", lag)
	}
	// An operator clears it (the runbook's XACK and XDEL): the worker's
	// next pass no longer meets it.
	clearEntry(t, c, key, left[0].ID, w)
	stop()
	if st := w.Stats(); st.Conflicts != 1 {
		t.Fatalf("stats %+v: want the conflict still counted once", st)
	}
	checkLedger(t, path, grants)
}

// clearEntry does what an operator does to an entry left for one (the
// runbook's XACK and XDEL of stream key's entry id), then waits until
// w's next pass no longer meets it.
func clearEntry(t *testing.T, c redis.UniversalClient, key, id string, w *settle.Worker) {
	t.Helper()
	ctx := context.Background()
	if err := c.XAck(ctx, key, "settle", id).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.XDel(ctx, key, id).Err(); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 20*time.Second, "no entry left for an operator", func() bool { return w.Stats().LeftForOperator == 0 })
}

// entryTime is when the stream entry id was added, by its shard's clock.
func entryTime(t *testing.T, id string) time.Time {
	t.Helper()
	ms, _, _ := strings.Cut(id, "-")
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.UnixMilli(at)
}

// poisonSink fails, every time, the delivery of one grant (serial bad),
// and delivers every other.
type poisonSink struct {
	bad       int64
	mu        sync.Mutex
	delivered map[int64]bool
	refused   int
}

func (s *poisonSink) Deliver(_ context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, g := range gs {
		if g.Serial == s.bad {
			s.refused++
			errs[i] = errors.New("wallet: 422 account frozen")
			continue
		}
		s.delivered[g.Serial] = true
	}
	return errs
}

// TestOneRefusedGrantSlowsNoOther: a grant the wallet refuses every time
// waits to be tried again on its own. With a wait of an hour for a
// failure, the worker still pays every other grant of the shard, many
// passes' worth (Batch 5), and tries the refused one again only at its
// time: before, a failed delivery put the whole shard's loop off for that
// hour, so that the grants of every pool there waited for one user's, past
// their hold.
func TestOneRefusedGrantSlowsNoOther(t *testing.T) {
	ge := grabtest.Start(t, 1, redistest.Options{})
	ctx := context.Background()
	const count = 60
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: "p", TotalCents: count * 100, Count: count, SubPools: 2}); err != nil {
		t.Fatal(err)
	}
	var bad int64
	for u := 0; u < count; u++ {
		r, err := ge.Service.Grab(ctx, "p", fmt.Sprintf("u%d", u))
		if err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab of u%d = %+v, %v", u, r, err)
		}
		if u == 0 {
			bad = r.Serial // the first grant: its entry is read first
		}
	}
	sink := &poisonSink{bad: bad, delivered: map[int64]bool{}}
	cfg := fastConfig("a")
	cfg.RetryDelay, cfg.MaxRetryDelay = time.Hour, time.Hour
	w := settle.New(ge.Shards, ge.Catalog, sink, cfg)
	run(t, w)
	waittest.Until(t, 20*time.Second, "every grant but the refused one paid", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return len(sink.delivered) == count-1 && sink.refused > 0
	})
	sink.mu.Lock()
	refused := sink.refused
	sink.mu.Unlock()
	if refused != 1 {
		t.Fatalf("the refused grant was tried %d times within its wait of an hour, want once", refused)
	}
}
