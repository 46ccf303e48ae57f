package grab_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"rain"
	"rain/internal/lua"
	"rain/internal/redistest"
)

// BenchmarkGrab: grabs through the service on 4 shards with AOF and
// appendfsync always (what rain serve requires), from many goroutines, with
// allocations; beside the minimal design on the same kind of shard: one
// claim script per grab, called at once by each goroutine, on one shard with
// appendfsync everysec. Both report grabs/s.
func BenchmarkGrab(b *testing.B) {
	const packets = 5_000_000
	ctx := context.Background()
	b.Run("rain", func(b *testing.B) {
		e := newEnv(b, 4, redistest.Options{AOF: true, Fsync: "always"})
		e.preload(b, rain.Spec{PoolID: "bench", TotalCents: packets, Count: packets, HoldSeconds: 3600})
		var n atomic.Int64
		b.SetParallelism(16)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := e.svc.Grab(ctx, "bench", "u"+strconv.FormatInt(n.Add(1), 10)); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grabs/s")
	})
	b.Run("one-script-per-grab-baseline", func(b *testing.B) {
		e := newEnv(b, 1, redistest.Options{AOF: true, Fsync: "everysec"})
		e.preload(b, rain.Spec{PoolID: "bench", TotalCents: packets, Count: packets, HoldSeconds: 3600})
		k := rain.SubPool{Pool: "bench", Index: 0}.Keys()
		c := e.shards.Client("s1")
		var n atomic.Int64
		b.SetParallelism(16)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := n.Add(1)
				if _, _, err := lua.ClaimMany(ctx, c, &k, 0, []lua.ClaimArg{{User: "u" + strconv.FormatInt(i, 10), Serial: i}}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grabs/s")
	})
}
