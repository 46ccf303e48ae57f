package settle_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/catalog"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

// replicaOf is the node of cl replicating primary p.
func replicaOf(t *testing.T, cl *redistest.Cluster, p *redistest.Server) *redistest.Server {
	t.Helper()
	_, port, _ := strings.Cut(p.Addr, ":")
	for _, n := range cl.Nodes {
		if n == p {
			continue
		}
		info, err := redistest.Client(t, n).Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_port:"+port+"\r") {
			return n
		}
	}
	t.Fatalf("no replica of %s", p.Addr)
	return nil
}

func role(t *testing.T, s *redistest.Server) string {
	r, err := redistest.Client(t, s).Do(context.Background(), "ROLE").Slice()
	if err != nil || len(r) == 0 {
		return ""
	}
	return fmt.Sprint(r[0])
}

// clusterSides opens the cluster cl as one shard s1 twice: a grab service
// and its catalogue (rain serve's side), and a shard set, checked at start
// as rain settle checks it, with its catalogue (the settle side).
func clusterSides(t *testing.T, cl *redistest.Cluster) (*grab.Service, *catalog.Catalog, *shard.Set, *catalog.Catalog) {
	t.Helper()
	specs, err := shard.ParseSpecs("s1=1@cluster/" + cl.Seeds())
	if err != nil {
		t.Fatal(err)
	}
	open := func() *shard.Set {
		set, err := shard.Open(specs, 0, shard.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { set.Close() })
		return set
	}
	_, gcat, svc := grabtest.Service(t, open(), grab.Config{})
	sset := open()
	if err := sset.CheckClusters(context.Background()); err != nil {
		t.Fatal(err)
	}
	return svc, gcat, sset, catalog.New(sset, catalog.Config{})
}

// TestConfirmWaitsAfterAFailover: a settle worker on a Redis Cluster whose
// primary fails over to its replica (CLUSTER FAILOVER: the old primary now
// its replica) confirms on the new primary only once a replica has the
// confirm, as before the failover: with the new primary's replica frozen,
// nothing is paid. (A confirm paid without one is lost when the new
// primary dies and the frozen one takes over: the grant held again,
// released by the reaper, its user granted again.)
func TestConfirmWaitsAfterAFailover(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, 1, redistest.Options{AOF: true, Fsync: "always", NodeTimeout: 2 * time.Second})
	svc, gcat, sset, scat := clusterSides(t, cl)
	if _, _, err := gcat.Preload(ctx, rain.Spec{PoolID: "fo", TotalCents: 10_000, Count: 100, SubPools: 1, HoldSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	p, err := gcat.Read(ctx, "fo")
	if err != nil {
		t.Fatal(err)
	}
	primary := cl.Owner(shard.Slot(p.SubPool(0).Keys().Meta))
	replica := replicaOf(t, cl, primary)
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	ledgerFile := openLedger(t, path)
	w0 := settle.New(sset, scat, ledgerFile, fastConfig("settle"))
	stop0 := run(t, w0)
	grabAll(t, svc, "fo", "before", 3)
	waittest.Until(t, 20*time.Second, "the 3 grants before the failover paid", func() bool { return w0.Stats().Delivered == 3 })
	stop0()

	if err := redistest.Client(t, replica).Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 30*time.Second, "the replica promoted, the old primary its replica", func() bool {
		return role(t, replica) == "master" && role(t, primary) == "slave"
	})
	cl.WaitOK()
	waittest.Until(t, 30*time.Second, "the old primary in sync with the new one", func() bool {
		info, err := redistest.Client(t, primary).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	// A grant waits for the new primary's replica (WAIT), whose first
	// acknowledgments may come late on a busy machine, and a shard that
	// answered none opens its breaker for a while: grab until three are
	// granted, as clients retry.
	granted, u := 0, 0
	waittest.Until(t, 30*time.Second, "3 grants after the failover", func() bool {
		u++
		if r, err := svc.Grab(ctx, "fo", fmt.Sprintf("after%d", u)); err == nil && r.Outcome == grab.Granted {
			granted++
		}
		return granted == 3
	})
	// The new primary's only replica stops acknowledging (a stalled host).
	primary.Pause()
	t.Cleanup(primary.Resume)
	w := settle.New(sset, scat, ledgerFile, fastConfig("settle"))
	run(t, w)
	waittest.Until(t, 15*time.Second, "three failed confirms, or a payout", func() bool {
		st := w.Stats()
		return st.Failures >= 3 || st.Delivered > 0
	})
	if paid := w.Stats().Delivered; paid != 0 {
		t.Fatalf("settle paid %d grants on the promoted primary while no replica could hold their confirms", paid)
	}
}

// TestConfirmFollowsAHalfMovedSlot: a reshard that stopped after moving a
// sub-pool's keys but before handing its slot over (the old primary
// MIGRATING, the new one IMPORTING) leaves the keys where the claim path
// follows them (ASK), and grants made there must be paid, not left to
// lapse until an operator finishes the move: the confirm, sent to the old
// primary rain's slot map names, meets ASK and goes to the new one after
// ASKING (loading rain's scripts there first when that primary has none),
// and, where it has a replica, waits for it. Every grant is paid and
// confirmed there.
func TestConfirmFollowsAHalfMovedSlot(t *testing.T) {
	for _, replicas := range []int{0, 1} {
		t.Run(fmt.Sprintf("%d replicas", replicas), func(t *testing.T) { confirmFollowsAHalfMovedSlot(t, replicas) })
	}
}

func confirmFollowsAHalfMovedSlot(t *testing.T, replicas int) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, replicas, redistest.Options{AOF: true, Fsync: "always"})
	svc, gcat, sset, scat := clusterSides(t, cl)
	if _, _, err := gcat.Preload(ctx, rain.Spec{PoolID: "hm", TotalCents: 10_000, Count: 100, SubPools: 1, HoldSeconds: 600}); err != nil {
		t.Fatal(err)
	}
	p, err := gcat.Read(ctx, "hm")
	if err != nil {
		t.Fatal(err)
	}
	k := p.SubPool(0).Keys()
	grabAll(t, svc, "hm", "u", 3)
	if owner, err := sset.Owner(ctx, "s1", k.Meta); err != nil || owner == "" { // settle's slot map, read now
		t.Fatalf("owner of the sub-pool: %q, %v", owner, err)
	}

	slot := shard.Slot(k.Meta)
	to := cl.OtherPrimary(cl.Owner(slot))
	cl.BeginMove(slot, to)
	cl.MoveKeys(slot, to, 0) // every key of the slot moved, the slot never handed over
	dst := redistest.Client(t, to)
	// The new primary never ran rain's scripts (its cache emptied): the
	// confirm through ASK meets NOSCRIPT there, loads them, and goes again.
	if err := dst.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	w := settle.New(sset, scat, openLedger(t, filepath.Join(t.TempDir(), "ledger.jsonl")), fastConfig("settle"))
	if replicas > 0 {
		// The new primary's replica stalls: nothing is paid while it lacks
		// the confirms. (Confirmed there, the grants' deadline index is
		// gone, and a key the script names that is missing on a node
		// importing the slot makes it answer TRYAGAIN: they are paid once
		// the move is finished.)
		rep := replicaOf(t, cl, to)
		rep.Pause()
		t.Cleanup(rep.Resume)
		run(t, w)
		waittest.Until(t, 20*time.Second, "confirms failing for want of a replica", func() bool { return w.Stats().Failures >= 3 })
		if st := w.Stats(); st.Delivered != 0 {
			t.Fatalf("stats %+v: paid with the new primary's replica frozen", st)
		}
		rep.Resume()
		cl.FinishMove(slot, to)
	} else {
		run(t, w)
	}
	waittest.Until(t, 20*time.Second, "the 3 grants paid", func() bool { return w.Stats().Delivered == 3 })
	pipe := dst.Pipeline() // the slot is not the new node's yet: ASKING first
	pipe.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
	all := pipe.HGetAll(ctx, k.Grants)
	_, _ = pipe.Exec(ctx)
	recs, err := all.Result()
	if err != nil || len(recs) != 3 {
		t.Fatalf("the grants on the node the keys went to: %v, %v", recs, err)
	}
	for user, rec := range recs {
		if !strings.HasPrefix(rec, "c:") {
			t.Errorf("%s's grant %q, want it confirmed", user, rec)
		}
	}
}
