package grab_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

// TestClaimOnANewPrimaryWaitsForItsReplica: a fourth primary joins the
// cluster with a replica of its own (scaling out) and a sub-pool's slot
// moves to it; rain, which has not read the cluster's primaries since, is
// led there by MOVED. With the new primary's replica frozen, a claim there
// is not answered granted: it waits for a replica as on every primary that
// has one, and no replica has it (an answer lost when the new primary then
// fails over).
func TestClaimOnANewPrimaryWaitsForItsReplica(t *testing.T) {
	ctx := context.Background()
	e, cl := clusterEnv(t, 1)
	d := cl.AddPrimary()
	dr := redistest.Start(t, redistest.Options{AOF: true, Fsync: "always", Cluster: true})
	did, err := redistest.Client(t, d).ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("redis-cli", "--cluster", "add-node", dr.Addr, d.Addr, "--cluster-slave", "--cluster-master-id", did).CombinedOutput(); err != nil {
		t.Fatalf("add a replica: %v %s", err, out)
	}
	waittest.Until(t, 30*time.Second, "the new primary's replica in sync", func() bool {
		info, err := redistest.Client(t, dr).Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	cl.WaitOK()
	e.preload(t, rain.Spec{PoolID: "mv", TotalCents: 10_000, Count: 100, SubPools: 1})
	if r, err := e.svc.Grab(ctx, "mv", "warm"); err != nil || r.Outcome != grab.Granted {
		t.Fatalf("first grab: %+v %v", r, err)
	}
	p, err := e.cat.Read(ctx, "mv")
	if err != nil {
		t.Fatal(err)
	}
	cl.MoveSlot(shard.Slot(p.SubPool(0).Keys().Meta), d, 0)
	dr.Pause()
	t.Cleanup(dr.Resume)
	r, err := e.svc.Grab(ctx, "mv", "victim")
	if err == nil && r.Outcome == grab.Granted {
		t.Fatalf("a claim on the new primary answered granted (serial %d) while its only replica was frozen", r.Serial)
	}
	if !errors.Is(err, grab.ErrOutcomeUnknown) {
		t.Fatalf("grab = %+v, %v; want outcome unknown (no replica confirmed it)", r, err)
	}
}

// TestClaimOnAPrimaryWithoutScripts: a sub-pool's slot moves to a primary
// that joined the cluster a moment ago and never ran rain's scripts; the
// first claim led there (MOVED) loads them and is granted, not refused.
func TestClaimOnAPrimaryWithoutScripts(t *testing.T) {
	ctx := context.Background()
	e, cl := clusterEnv(t, 0)
	e.preload(t, rain.Spec{PoolID: "ns", TotalCents: 10_000, Count: 100, SubPools: 1})
	if r, err := e.svc.Grab(ctx, "ns", "warm"); err != nil || r.Outcome != grab.Granted {
		t.Fatalf("first grab: %+v %v", r, err)
	}
	d := cl.AddPrimary()
	if _, err := e.shards.Primaries(ctx, "c1"); err != nil { // rain knows d has no replica
		t.Fatal(err)
	}
	p, err := e.cat.Read(ctx, "ns")
	if err != nil {
		t.Fatal(err)
	}
	cl.MoveSlot(shard.Slot(p.SubPool(0).Keys().Meta), d, 0)
	if r, err := e.svc.Grab(ctx, "ns", "first-on-d"); err != nil || r.Outcome != grab.Granted {
		t.Fatalf("the first claim led to a primary without rain's scripts = %+v, %v; want granted", r, err)
	}
}
