// Package grabtest starts rain's grab path on real redis-server shards, for
// the tests of the packages a rain instance is built from (grab's own, api,
// settle, reaper), which cannot import internal/instance (it imports them):
// the serial generator, the catalogue and the grab service, wired as
// instance.New wires them. Service is the one place the tests wire them.
// rain's tests never mock Redis.
package grabtest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain/internal/catalog"
	"rain/internal/grab"
	"rain/internal/idgen"
	"rain/internal/lua"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/shard/shardtest"
)

// Env is a grab service on n shards named s1..sn, weight 1 each; s1 is the
// serial shard.
type Env struct {
	Servers []*redistest.Server
	Shards  *shard.Set
	Clients []redis.UniversalClient // one per shard, in name order
	Serials *idgen.Generator
	Catalog *catalog.Catalog
	Service *grab.Service
}

// Start starts n redis-server shards and the service on them; everything
// is stopped in tb's cleanup, the service first.
func Start(tb testing.TB, n int, opts redistest.Options) *Env {
	tb.Helper()
	servers := redistest.StartN(tb, n, opts)
	return On(tb, servers, redistest.Addrs(servers))
}

// On is the service on servers, reached at addrs (theirs, or proxies in
// front of them), with rain serve's client options, go-redis's retries
// included. Its grants' outbox entries are packed (rain serve --outbox
// packed) and its batches' grants share a deadline index member (rain
// serve --deadline-index batch), so the packages that test with it settle
// and reap those forms; rain serve's own tests run its defaults.
func On(tb testing.TB, servers []*redistest.Server, addrs []string) *Env {
	tb.Helper()
	set := shardtest.Open(tb, addrs, shard.Options{})
	e := &Env{Servers: servers, Shards: set}
	e.Serials, e.Catalog, e.Service = Service(tb, set, grab.Config{Form: lua.Form{Outbox: lua.OutboxBatch, BatchedDeadlines: true}})
	for _, name := range set.Names() {
		e.Clients = append(e.Clients, set.Client(name))
	}
	return e
}

// Service is a serial generator on set's serial shard (watermark copies on
// the others), a catalogue and a grab service with cfg (its Serials,
// Shards and Pools filled in) on set: one more instance's grab path on the same
// shards.
func Service(tb testing.TB, set *shard.Set, cfg grab.Config) (*idgen.Generator, *catalog.Catalog, *grab.Service) {
	tb.Helper()
	gen, err := idgen.ForShards(context.Background(), set, idgen.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { gen.Close() })
	cat := catalog.New(set, catalog.Config{})
	cfg.Serials, cfg.Shards, cfg.Pools = gen, set, cat
	svc := grab.New(cfg)
	tb.Cleanup(svc.Close)
	return gen, cat, svc
}
