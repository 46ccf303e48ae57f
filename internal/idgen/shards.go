package idgen

// This file wires a generator onto rain's shards: the one constructor that
// rain serve, the tools and the tests share.

import (
	"context"
	"fmt"
	"strconv"

	"rain/internal/shard"
)

// ForShards returns a generator whose counter (Key) lives on the set's
// serial shard (shard.Options.Serial), with watermark copies on every other shard and, when the serial
// shard is a Redis Cluster, on each of its other primaries too (keys whose
// slots fall there): losing one primary's or shard's tail of writes can
// never hand a serial out twice (see RedisAllocator).
func ForShards(ctx context.Context, set *shard.Set, cfg Config) (*Generator, error) {
	serial := set.Serial()
	var mirrors []Mirror
	for _, c := range set.Except(serial) {
		mirrors = append(mirrors, Mirror{C: c, Key: Key + ":watermark"})
	}
	if set.IsCluster(serial) {
		cm, err := clusterMirrors(ctx, set, serial)
		if err != nil {
			return nil, err
		}
		mirrors = append(mirrors, cm...)
	}
	return New(NewRedisAllocatorMirrors(set.Client(serial), Key, mirrors), cfg)
}

// clusterMirrors is a watermark copy on every primary of cluster shard
// serial but the one that owns the counter, each a key whose hash tag puts
// it there (as the primaries stand now; a reshard may bring two copies
// together later, which weakens the copies, never the counter).
func clusterMirrors(ctx context.Context, set *shard.Set, serial string) ([]Mirror, error) {
	ps, err := set.Primaries(ctx, serial)
	if err != nil {
		return nil, err
	}
	counter := shard.Slot(Key)
	var out []Mirror
	for _, p := range ps {
		if p.Owns(counter) {
			continue
		}
		key, err := keyOn(p)
		if err != nil {
			return nil, err
		}
		out = append(out, Mirror{C: set.Client(serial), Key: key})
	}
	return out, nil
}

// keyOn is a watermark key whose slot is on primary p.
func keyOn(p shard.Primary) (string, error) {
	for s := range 1 << 16 {
		key := Key + ":watermark:{w" + strconv.Itoa(s) + "}"
		if p.Owns(shard.Slot(key)) {
			return key, nil
		}
	}
	return "", fmt.Errorf("idgen: no watermark key falls on primary %s", p.Addr)
}
