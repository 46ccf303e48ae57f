package lua

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain/internal/redistest"
)

// BenchmarkFunctionOrScript runs claim_many as rain serve sends it (its
// library's function, FCALL) and as a script (EVALSHA, the try-it mode's
// form) side by side, each on a redis-server of its own with AOF and
// appendfsync always, one batch of new users to each in turn; it reports
// each server's CPU (INFO: used_cpu_sys + used_cpu_user) and script time
// (commandstats usec, wall) per batch.
//
//	go test -run x -bench FunctionOrScript -benchtime 3000x ./internal/lua
func BenchmarkFunctionOrScript(b *testing.B) {
	for _, n := range []int{1, 4, 16} {
		b.Run("batch="+strconv.Itoa(n), func(b *testing.B) {
			ctx := context.Background()
			names := []string{"function", "script"}
			claims := make([]*rainClaims, 2)
			for i := range names {
				c := redistest.Client(b, redistest.Start(b, redistest.Options{AOF: true, Fsync: "always"}))
				claims[i] = &rainClaims{c: c, form: benchForm}
				if i == 1 {
					claims[i].script = redis.NewScript(prelude + source("claim_many"))
				}
				if err := claims[i].refill(ctx, benchPackets); err != nil {
					b.Fatal(err)
				}
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
			}
			cpu0 := make([]float64, 2)
			for i := range claims {
				cpu0[i], _ = (&redisMeter{c: claims[i].c}).read(b)
			}
			var next int64
			for b.Loop() {
				for _, cl := range claims {
					if err := cl.batch(ctx, next, n); err != nil {
						b.Fatal(err)
					}
				}
				next += int64(n)
			}
			for i, v := range names {
				cpu, lua := (&redisMeter{c: claims[i].c}).read(b)
				b.ReportMetric((cpu-cpu0[i])/float64(b.N), v+"-cpu-us/batch")
				b.ReportMetric(lua/float64(b.N), v+"-lua-us/batch")
			}
		})
	}
}
