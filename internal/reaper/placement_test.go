package reaper

import (
	"context"
	"errors"
	"strings"
	"testing"

	"rain"
	"rain/internal/grabtest"
	"rain/internal/redistest"
)

// TestSweepWithoutAPlacementShard: a reaper whose process lacks a shard a
// pool was placed on (a shard added to the ring, an instance not yet
// restarted with it) sweeps the sub-pools it can reach and returns
// ErrUnavailable naming the shard it lacks, never a panic (which would take
// rain serve down whenever it became the leader).
func TestSweepWithoutAPlacementShard(t *testing.T) {
	ctx := context.Background()
	ge := grabtest.Start(t, 3, redistest.Options{})
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: "p", TotalCents: 3_000, Count: 30, SubPools: 3}); err != nil {
		t.Fatal(err)
	}
	short := grabtest.On(t, ge.Servers[:2], redistest.Addrs(ge.Servers[:2]))
	if _, err := New(short.Shards, short.Catalog, nil, Config{}).Sweep(ctx); !errors.Is(err, rain.ErrUnavailable) || !strings.Contains(err.Error(), "s3") {
		t.Fatalf("a sweep without the pool's shard s3 = %v; want unavailable, naming s3", err)
	}
}
