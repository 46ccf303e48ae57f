package grab_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/shard/shardtest"
)

// TestHeldShardIsSentNoClaim: a shard Config.Held names (its durability
// not known yet) is sent no claim: its users are answered unavailable,
// nothing granted and nothing written there, while the other shard's are
// served; once released it serves its users.
func TestHeldShardIsSentNoClaim(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 2, redistest.Options{})
	set := shardtest.Open(t, redistest.Addrs(servers), shard.Options{})
	var held atomic.Bool
	held.Store(true)
	_, cat, svc := grabtest.Service(t, set, grab.Config{Held: func(name string) bool { return name == "s2" && held.Load() }})
	_, _, err := cat.Preload(ctx, rain.Spec{PoolID: "h", TotalCents: 4000, Count: 40, SubPools: 2})
	if err != nil {
		t.Fatal(err)
	}
	p, err := cat.Cached(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	var onS1, onS2 []string
	for i := 0; len(onS1) < 3 || len(onS2) < 3; i++ {
		u := fmt.Sprintf("u%d", i)
		if p.Placement[p.Home(u)] == "s2" {
			onS2 = append(onS2, u)
		} else {
			onS1 = append(onS1, u)
		}
	}
	for _, u := range onS2[:3] {
		if r, err := svc.Grab(ctx, "h", u); !errors.Is(err, grab.ErrUnavailable) {
			t.Fatalf("grab of %s, homed on the held shard = %+v, %v; want unavailable", u, r, err)
		}
	}
	for _, u := range onS1[:3] {
		if r, err := svc.Grab(ctx, "h", u); err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab of %s on the other shard = %+v, %v; want granted", u, r, err)
		}
	}
	s2 := redistest.Client(t, servers[1])
	for j := range p.SubPools() {
		if p.Placement[j] != "s2" {
			continue
		}
		if n, err := s2.HLen(ctx, p.SubPool(j).Keys().Grants).Result(); err != nil || n != 0 {
			t.Fatalf("the held shard holds %d grants (%v), want none", n, err)
		}
	}
	held.Store(false)
	for _, u := range onS2[:3] {
		if r, err := svc.Grab(ctx, "h", u); err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab of %s once the shard is released = %+v, %v; want granted", u, r, err)
		}
	}
}
