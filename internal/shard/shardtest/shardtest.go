// Package shardtest gives tests rain's shards the one way they are laid out
// in tests: shards named s1, s2, ..., sN, weight 1 each, listed in that
// order (so s1 is the serial shard), opened with rain serve's client
// options (go-redis's retries included) unless a test says otherwise.
// The servers behind them are real redis-server processes
// (internal/redistest), or proxies in front of them; rain's tests never
// mock Redis.
package shardtest

import (
	"fmt"
	"strings"
	"testing"

	"rain/internal/redistest"
	"rain/internal/shard"
)

// Specs are shards s1..sN at addrs, in order, weight 1 each.
func Specs(addrs []string) []shard.Spec {
	specs := make([]shard.Spec, len(addrs))
	for i, a := range addrs {
		specs[i] = shard.Spec{Name: fmt.Sprintf("s%d", i+1), Weight: 1, Addr: a}
	}
	return specs
}

// Flag is Specs as rain's --redis (RAIN_REDIS) takes them:
// "s1=1@addr1,s2=1@addr2,...".
func Flag(addrs []string) string {
	items := make([]string, len(addrs))
	for i, sp := range Specs(addrs) {
		items[i] = fmt.Sprintf("%s=%d@%s", sp.Name, sp.Weight, sp.Addr)
	}
	return strings.Join(items, ",")
}

// Open opens shards s1..sN at addrs with opts; the set is closed in tb's
// cleanup.
func Open(tb testing.TB, addrs []string, opts shard.Options) *shard.Set {
	tb.Helper()
	set, err := shard.Open(Specs(addrs), 0, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { set.Close() })
	return set
}

// Start starts n redis-server processes with opts and opens shards s1..sn
// on them, with rain serve's client options; everything is stopped in tb's
// cleanup.
func Start(tb testing.TB, n int, opts redistest.Options) ([]*redistest.Server, *shard.Set) {
	tb.Helper()
	servers := redistest.StartN(tb, n, opts)
	return servers, Open(tb, redistest.Addrs(servers), shard.Options{})
}
