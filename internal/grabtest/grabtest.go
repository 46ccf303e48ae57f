// Package grabtest starts rain's grab service on real redis-server shards,
// for the tests of the packages built on it (api, settle, reaper). rain's
// tests never mock Redis.
package grabtest

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain/internal/grab"
	"rain/internal/idgen"
	"rain/internal/redistest"
	"rain/internal/shard"
)

// Env is a grab service on n shards named s1..sn, weight 1 each.
type Env struct {
	Servers []*redistest.Server
	Shards  *shard.Set
	Clients []*redis.Client // one per shard, in name order
	Serials *idgen.Generator
	Service *grab.Service
}

// Start starts n redis-server shards and the service on them; everything
// is stopped in tb's cleanup, the service first.
func Start(tb testing.TB, n int, opts redistest.Options) *Env {
	tb.Helper()
	servers := redistest.StartN(tb, n, opts)
	specs := make([]shard.Spec, n)
	for i, s := range servers {
		specs[i] = shard.Spec{Name: fmt.Sprintf("s%d", i+1), Weight: 1, Addr: s.Addr}
	}
	// The options of rain serve, go-redis's retries included.
	set, err := shard.Open(specs, 0, shard.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { set.Close() })
	gen, err := idgen.New(idgen.NewRedisAllocator(set.Client("s1"), idgen.Key, set.Except("s1")...), idgen.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { gen.Close() })
	svc := grab.New(set, grab.Config{Serials: gen, Arbiter: "s1"})
	tb.Cleanup(svc.Close)
	e := &Env{Servers: servers, Shards: set, Serials: gen, Service: svc}
	for _, name := range set.Names() {
		e.Clients = append(e.Clients, set.Client(name))
	}
	return e
}
