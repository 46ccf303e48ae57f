package grab_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// TestSpillTakeWaitsForAReplica: a spill takes an amount at a sibling
// whose shard has replicas (Sentinel), then grants it at the home. The
// take must be on a replica before the home grants: with the sibling's
// replica cut off the grab is refused (503, nothing granted), and a
// failover then (the primary killed, the replica promoted) leaves the
// amount in the sibling's stock with no transfer and no grant at home:
// nothing is granted twice (invariant 5).
func TestSpillTakeWaitsForAReplica(t *testing.T) {
	ctx := context.Background()
	rs := redistest.StartReplicated(t) // its Sentinel never fails it over here
	primary, replica := rs.Primary, rs.Replica
	plain := redistest.Start(t, redistest.Options{AOF: true, Fsync: "always"})
	rc := redistest.Client(t, replica)
	ge := grabtest.On(t, []*redistest.Server{primary, plain}, []string{rs.Spec(), plain.Addr})
	id := ""
	for i := 0; id == ""; i++ { // sub-pool 0 (the home) on the plain shard s2, 1 on the Sentinel shard s1
		if c := fmt.Sprintf("sp%d", i); ge.Shards.Ring().Distinct(c, 2)[0] == "s2" {
			id = c
		}
	}
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: id, TotalCents: 1_000, Count: 10, SubPools: 2}); err != nil {
		t.Fatal(err)
	}
	p, err := ge.Catalog.Read(ctx, id)
	if err != nil || p.Placement[0] != "s2" || p.Placement[1] != "s1" {
		t.Fatalf("placement %v, %v", p.Placement, err)
	}
	var home []string // users of sub-pool 0: five empty it, the sixth spills
	for u := 0; len(home) < 6; u++ {
		if name := fmt.Sprintf("u%d", u); p.Home(name) == 0 {
			home = append(home, name)
		}
	}
	for _, u := range home[:5] {
		if r, err := ge.Service.Grab(ctx, id, u); err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab of %s = %+v, %v", u, r, err)
		}
	}
	k1 := p.SubPool(1).Keys()
	waittest.Until(t, 10*time.Second, "the replica has sub-pool 1 as it is", func() bool {
		n, err := rc.HGet(ctx, k1.Meta, "stock_count").Result()
		return err == nil && n == "5"
	})
	pc := redistest.Clients(t, []*redistest.Server{primary})[0]
	replica.Pause() // s1's replica stops hearing its primary
	t.Cleanup(replica.Resume)
	if err := pc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	r, err := ge.Service.Grab(ctx, id, home[5]) // spills to sub-pool 1 on s1
	if !errors.Is(err, grab.ErrUnavailable) {
		t.Fatalf("a spill whose take no replica holds = %+v, %v; want unavailable, nothing granted", r, err)
	}
	primary.Kill() // the failover: s1's replica, which never got the take, is promoted
	replica.Resume()
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := rc.HGet(ctx, k1.Meta, "stock_count").Result(); n != "5" {
		t.Fatalf("the promoted sibling holds %s packets, want 5", n)
	}
	k0 := p.SubPool(0).Keys()
	if g, _ := ge.Clients[1].HGet(ctx, k0.Grants, home[5]).Result(); g != "" {
		t.Fatalf("the user holds %q at home: granted from a take the sibling lost", g)
	}
}

// TestClaimWaitsForAReplica: on a shard with replicas (Sentinel) a claim's
// grant is answered only once a replica has it (the batch's WAIT). With the
// replica frozen, the claim runs on the primary and grants, but its
// answer is an unknown outcome, never "granted"; a failover then (the
// primary killed, the frozen replica promoted) loses that grant, which no
// client was told of, and keeps the one answered before the freeze
// (invariant 5: acknowledged means durable, with replicas).
func TestClaimWaitsForAReplica(t *testing.T) {
	ctx := context.Background()
	rs := redistest.StartReplicated(t) // its Sentinel never fails it over here
	primary, replica := rs.Primary, rs.Replica
	plain := redistest.Start(t, redistest.Options{AOF: true, Fsync: "always"})
	rc := redistest.Client(t, replica)
	ge := grabtest.On(t, []*redistest.Server{plain, primary}, []string{plain.Addr, rs.Spec()})
	id := ""
	for i := 0; id == ""; i++ { // the pool's one sub-pool on the Sentinel shard, s2
		if c := fmt.Sprintf("rp%d", i); ge.Shards.Ring().Distinct(c, 1)[0] == "s2" {
			id = c
		}
	}
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: id, TotalCents: 1_000, Count: 10, SubPools: 1}); err != nil {
		t.Fatal(err)
	}
	p, err := ge.Catalog.Read(ctx, id)
	if err != nil || p.Placement[0] != "s2" {
		t.Fatalf("placement %v, %v", p.Placement, err)
	}
	k := p.SubPool(0).Keys()
	before, err := ge.Service.Grab(ctx, id, "u0")
	if err != nil || before.Outcome != grab.Granted {
		t.Fatalf("grab of u0 with the replica in sync = %+v, %v", before, err)
	}
	waittest.Until(t, 10*time.Second, "the replica has u0's grant", func() bool {
		g, err := rc.HGet(ctx, k.Grants, "u0").Result()
		return err == nil && g != ""
	})
	pc := redistest.Clients(t, []*redistest.Server{primary})[0]
	replica.Pause() // the replica stops hearing its primary
	t.Cleanup(replica.Resume)
	if err := pc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	r, err := ge.Service.Grab(ctx, id, "u1")
	if !errors.Is(err, grab.ErrOutcomeUnknown) {
		t.Fatalf("a grant no replica holds = %+v, %v; want outcome unknown, not granted", r, err)
	}
	if g, err := pc.HGet(ctx, k.Grants, "u1").Result(); err != nil || g == "" {
		t.Fatalf("u1's grant on the primary = %q, %v; want one: the claim ran, only its WAIT failed", g, err)
	}
	primary.Kill() // the failover: the replica, which never got u1's grant, is promoted
	replica.Resume()
	if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	if g, _ := rc.HGet(ctx, k.Grants, "u1").Result(); g != "" {
		t.Fatalf("the promoted replica holds u1's grant %q: it had it before the grab was answered", g)
	}
	if g, err := rc.HGet(ctx, k.Grants, "u0").Result(); err != nil || g == "" {
		t.Fatalf("u0's answered grant after the failover = %q, %v; want it kept", g, err)
	}
	if n, _ := rc.HGet(ctx, k.Meta, "stock_count").Result(); n != "9" {
		t.Fatalf("the promoted replica holds %s packets, want 9 (only u0's granted)", n)
	}
}
