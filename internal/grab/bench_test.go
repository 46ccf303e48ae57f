package grab

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"rain/internal/lua"
	"rain/internal/redistest"
	"rain/internal/split"
)

// BenchmarkPreload: 1,000,000 packets into 8 sub-pools on 4 local shards
// (target ≤ 3 s per op), beside the bare minimum: the same amounts pushed
// with pipelined RPUSH of 1,000 and no scripts, bookkeeping or split.
func BenchmarkPreload(b *testing.B) {
	const count, total = 1_000_000, 500_000_000
	b.Run("rain", func(b *testing.B) {
		e := newEnv(b, 4, redistest.Options{})
		i := 0
		for b.Loop() {
			i++
			_, created, err := e.svc.Preload(context.Background(), Spec{
				PoolID: fmt.Sprintf("bench%d", i), TotalCents: total, Count: count, SubPools: 8})
			if err != nil || !created {
				b.Fatalf("Preload: created %v, %v", created, err)
			}
		}
		b.ReportMetric(float64(count)*float64(b.N)/b.Elapsed().Seconds(), "packets/s")
	})
	b.Run("rpush-baseline", func(b *testing.B) {
		e := newEnv(b, 4, redistest.Options{})
		amounts, err := split.Amounts(rand.New(rand.NewPCG(1, 2)), split.Spec{TotalCents: total, Count: count})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		i := 0
		for b.Loop() {
			i++
			// 8 lists, two per shard, loaded one after another per shard.
			done := make(chan error, 4)
			for s, name := range e.shards.Names() {
				c := e.shards.Client(name)
				go func() {
					pipe := c.Pipeline()
					for part := range 2 {
						key := fmt.Sprintf("base%d:%d:%d", i, s, part)
						lo := (s*2 + part) * count / 8
						for off := lo; off < lo+count/8; off += 1000 {
							args := make([]any, 0, 1000)
							for _, a := range amounts[off:min(off+1000, lo+count/8)] {
								args = append(args, a)
							}
							pipe.RPush(ctx, key, args...)
							if pipe.Len() == batchesPerTrip {
								if _, err := pipe.Exec(ctx); err != nil {
									done <- err
									return
								}
							}
						}
					}
					_, err := pipe.Exec(ctx)
					done <- err
				}()
			}
			for range 4 {
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(count)*float64(b.N)/b.Elapsed().Seconds(), "packets/s")
	})
}

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
		e.preload(b, Spec{PoolID: "bench", TotalCents: packets, Count: packets, HoldSeconds: 3600})
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
		e.preload(b, Spec{PoolID: "bench", TotalCents: packets, Count: packets, HoldSeconds: 3600})
		k := lua.SubPool{Pool: "bench", Index: 0}.Keys()
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
