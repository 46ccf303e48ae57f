package chaos

import (
	"context"
	"testing"
	"time"

	"rain/internal/redistest"
)

// watchFsyncs turns on the latency monitors of servers for fsyncs of 100 ms
// or more, and returns slowest: the slowest fsync (appendfsync always) of
// each server since the last call, in the order of servers, 0 for none
// that long; each call resets the monitors. Invariant 10 holds a shard to
// the budget: a shard whose fsync lands past it may be cut off, and on this
// machine, loaded with every other package's tests, the disk now and then
// holds an fsync that long on every shard at once.
func watchFsyncs(t *testing.T, servers []*redistest.Server) (slowest func() []time.Duration) {
	ctx := context.Background()
	for _, srv := range servers {
		if err := redistest.Client(t, srv).ConfigSet(ctx, "latency-monitor-threshold", "100").Err(); err != nil {
			t.Fatal(err)
		}
	}
	return func() []time.Duration {
		out := make([]time.Duration, len(servers))
		for i, srv := range servers {
			c := redistest.Client(t, srv)
			if ev, err := c.Do(ctx, "LATENCY", "LATEST").Slice(); err == nil {
				for _, e := range ev {
					// An event: its name, when, the latest ms, the most ms.
					if f, ok := e.([]any); ok && len(f) >= 4 && f[0] == "aof-fsync-always" {
						if ms, ok := f[3].(int64); ok {
							out[i] = time.Duration(ms) * time.Millisecond
						}
					}
				}
			}
			_ = c.Do(ctx, "LATENCY", "RESET").Err()
		}
		return out
	}
}
