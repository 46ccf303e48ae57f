package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/instance"
	"rain/internal/ledger"
	"rain/internal/logtest"
	"rain/internal/reaper"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

// clusterInstance is one rain serve on a cluster shard c1 (the serial
// shard) of cl, built as rain serve builds it.
func clusterInstance(t *testing.T, cl *redistest.Cluster, tweak func(*instance.Config)) *instance.Instance {
	t.Helper()
	specs, err := shard.ParseSpecs("c1=1@cluster/" + cl.Seeds())
	if err != nil {
		t.Fatal(err)
	}
	in, _ := startInstance(t, specs, tweak)
	return in
}

// TestClusterFailover: a cluster of three primaries with a replica each
// (cluster-node-timeout 1s); the primary of a sub-pool is killed (-9) in a
// rain of grabs. The cluster promotes its replica by itself, and grabs on
// that sub-pool go on there; every grant answered 200, before and after,
// is on the cluster as answered (rain waits for the primary's replica after
// each batch), nobody holds two, and the audit is ok.
func TestClusterFailover(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, 1, redistest.Options{AOF: true, Fsync: "always", NodeTimeout: time.Second})
	var logs lines
	in := clusterInstance(t, cl, func(c *instance.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.ClusterWatch = 200 * time.Millisecond
	})
	st, _, err := in.Catalog.Preload(ctx, rain.Spec{PoolID: "fo", TotalCents: 3_000_000, Count: 300_000})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.SubPools) != 3 {
		t.Fatalf("%d sub-pools, want 3 (one per primary)", len(st.SubPools))
	}
	p, err := in.Catalog.Read(ctx, "fo")
	if err != nil {
		t.Fatal(err)
	}
	victim := cl.Owner(shard.Slot(p.SubPool(0).Keys().Meta))
	var (
		mu        sync.Mutex
		answered  = map[string]grab.Result{}
		killed    bool
		resumedAt time.Time
		before    int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				u := fmt.Sprintf("w%d.%d", w, i)
				mu.Lock()
				afterKill := killed
				mu.Unlock()
				r, err := in.Grabs.Grab(ctx, "fo", u)
				mu.Lock()
				switch {
				case err == nil && r.Outcome == grab.Granted:
					answered[u] = r
					if p.Home(u) == 0 {
						if !afterKill {
							before++
						} else if resumedAt.IsZero() {
							resumedAt = time.Now()
						}
					}
				case err != nil && !errors.Is(err, grab.ErrUnavailable) && !errors.Is(err, grab.ErrOutcomeUnknown) && !errors.Is(err, grab.ErrBusy):
					t.Errorf("grab %s: %v", u, err)
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	waittest.Until(t, 20*time.Second, "grants on the victim's sub-pool before the kill", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return before >= 50
	})
	killedAt := time.Now()
	victim.Kill()
	mu.Lock()
	killed = true
	mu.Unlock()
	waittest.Until(t, 40*time.Second, "grants on the victim's sub-pool after its replica took over", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !resumedAt.IsZero() && time.Since(resumedAt) > 500*time.Millisecond
	})
	close(stop)
	wg.Wait()
	t.Logf("grabs on the killed primary's sub-pool resumed %v after the kill; %d grants answered", resumedAt.Sub(killedAt).Round(time.Millisecond), len(answered))
	c := in.Shards.Client("c1")
	for u, r := range answered {
		k := p.SubPool(p.Home(u)).Keys()
		rec, err := c.HGet(ctx, k.Grants, u).Result()
		if err != nil || !strings.Contains(rec, fmt.Sprintf(":%d:%d:", r.Amount, r.Serial)) {
			t.Fatalf("%s was answered %+v; the cluster holds %q (%v)", u, r, rec, err)
		}
	}
	if rep, err := in.Catalog.Audit(ctx, "fo"); err != nil || !rep.OK {
		t.Fatalf("audit after the failover = %+v, %v", rep, err)
	}
	// The change is logged: the dead primary out, its replica in (one line
	// or two: the watch may read the cluster between the two).
	defer func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	}()
	waittest.Until(t, 10*time.Second, "a log line naming the failover", func() bool {
		out := logs.has(func(l string) bool {
			return strings.Contains(l, "the primaries of a cluster shard changed") && strings.Contains(l, "removed=["+victim.Addr+"]")
		})
		back := logs.has(func(l string) bool {
			return strings.Contains(l, "the primaries of a cluster shard changed") && !strings.Contains(l, "added=[]") && strings.Contains(l, "primaries=3")
		})
		return out && back
	})
}

// lines is a log sink tests can read while it is written.
type lines struct{ logtest.Buffer }

// has reports whether a line satisfies ok.
func (l *lines) has(ok func(string) bool) bool {
	return slices.ContainsFunc(strings.Split(l.String(), "\n"), ok)
}

// TestClusterPoolLife: a pool's whole life on a cluster shard: grants
// released by the reaper at their deadline, the rest settled into a
// ledger by a settle worker reading each outbox on its own, the pool ended
// and closed with an exact account, its sub-pools retired (tombstones in
// their own slots), and the shard's primaries' durability read one by one.
func TestClusterPoolLife(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, 0, redistest.Options{AOF: true, Fsync: "always"})
	in := clusterInstance(t, cl, func(c *instance.Config) {
		c.Reaper = reaper.Config{Interval: 100 * time.Millisecond}
	})
	if _, _, err := in.Catalog.Preload(ctx, rain.Spec{PoolID: "life", TotalCents: 30_000, Count: 300, SubPools: 3, HoldSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	for u := range 30 { // held past their hold: the reaper gives them back
		if r, err := in.Grabs.Grab(ctx, "life", fmt.Sprintf("early%d", u)); err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab = %+v, %v", r, err)
		}
	}
	waittest.Until(t, 20*time.Second, "the reaper released the unconfirmed grants", func() bool {
		st, err := in.Catalog.Status(ctx, "life")
		return err == nil && st.ReleasedCount == 30 && st.HeldCount == 0
	})
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	books, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer books.Close()
	w := settle.New(in.Shards, in.Catalog, books, settle.Config{Consumer: "c", Block: 50 * time.Millisecond, Refresh: 50 * time.Millisecond})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.Run(wctx) }()
	defer func() { stop(); <-done }()
	var cents int64
	for u := range 60 {
		r, err := in.Grabs.Grab(ctx, "life", fmt.Sprintf("paid%d", u))
		if err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab = %+v, %v", r, err)
		}
		cents += r.Amount
	}
	waittest.Until(t, 20*time.Second, "every grant settled", func() bool { return w.Stats().Delivered == 60 })
	if _, err := in.Catalog.End(ctx, "life"); err != nil {
		t.Fatal(err)
	}
	var a *rain.Account
	waittest.Until(t, 20*time.Second, "the pool closes", func() bool {
		a, err = in.Catalog.Close(ctx, "life")
		return err == nil
	})
	if a.ConfirmedCount != 60 || a.ConfirmedCents != cents || a.UnclaimedCount != 240 || a.PreloadedCents != 30_000 {
		t.Fatalf("account %+v; want 60 confirmed (%d cents) of 300", a, cents)
	}
	p, err := in.Catalog.Read(ctx, "life")
	if err != nil || p.State != rain.Closed {
		t.Fatalf("Read = %+v, %v", p, err)
	}
	for j := range p.SubPools() {
		k := p.SubPool(j).Keys()
		for _, key := range k.All() {
			n, err := in.Shards.Client("c1").Exists(ctx, key).Result()
			if err != nil || (key == k.Meta) != (n == 1) {
				t.Errorf("after the close %s exists %d (%v); want only the tombstone meta", key, n, err)
			}
		}
	}
	ds := in.Shards.Durability(ctx)
	if len(ds) != 3 {
		t.Fatalf("durability read for %d servers, want the 3 primaries: %v", len(ds), ds)
	}
	for _, d := range ds {
		if !d.Durable() || !strings.HasPrefix(d.Shard, "c1/") {
			t.Errorf("durability %s", d)
		}
	}
}
