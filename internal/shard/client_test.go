package shard

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain/internal/redistest"
)

// dialCounter is a go-redis hook that counts the dials of a client.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (d *dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRefusedDialNotRetried: a call to a shard whose host refuses the
// connection (the shard is down) dials once and fails, with rain's client
// options: go-redis's retries (with their backoff) would only hold back an
// answer the breaker is waiting for. Both for a shard that was never up
// and for one killed under a pooled connection (the call's first try meets
// the dead connection, its retry the refusal).
func TestRefusedDialNotRetried(t *testing.T) {
	for _, tt := range []struct {
		name   string
		pooled bool // a connection to the shard is pooled when it dies
	}{{"never up", false}, {"killed under a pooled connection", true}} {
		t.Run(tt.name, func(t *testing.T) {
			dials := &dialCounter{}
			ctx := context.Background()
			srv := redistest.Start(t, redistest.Options{})
			c := NewClient(srv.Addr, Options{})
			t.Cleanup(func() { c.Close() })
			c.AddHook(dials)
			if tt.pooled {
				if err := c.Ping(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			srv.Kill()
			before := dials.n.Load()
			err := c.Ping(ctx).Err()
			if err == nil || !strings.Contains(err.Error(), "refused") {
				t.Fatalf("PING to a killed shard: %v, want connection refused", err)
			}
			if n := dials.n.Load() - before; n != 1 {
				t.Fatalf("the call dialed %d times, want once (a refusal is not retried)", n)
			}
		})
	}
}
