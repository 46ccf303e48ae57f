package shardtest

import (
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain/internal/redistest"
	"rain/internal/shard"
)

// TestLayout: Flag is what rain's --redis parser reads back as Specs, and
// Start's shards are s1..sn on the servers, in order, s1 the serial shard.
func TestLayout(t *testing.T) {
	addrs := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}
	parsed, err := shard.ParseSpecs(Flag(addrs))
	if err != nil || !slices.Equal(parsed, Specs(addrs)) {
		t.Fatalf("ParseSpecs(Flag(%v)) = %v, %v; want %v", addrs, parsed, err, Specs(addrs))
	}
	servers, set := Start(t, 2, redistest.Options{})
	if !slices.Equal(set.Names(), []string{"s1", "s2"}) || set.Serial() != "s1" {
		t.Fatalf("Start: shards %v, serial %s; want [s1 s2], serial s1", set.Names(), set.Serial())
	}
	for i, name := range set.Names() {
		if got := set.Client(name).(*redis.Client).Options().Addr; got != servers[i].Addr {
			t.Fatalf("shard %s is at %s, want %s", name, got, servers[i].Addr)
		}
	}
}
