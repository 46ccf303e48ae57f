package main

// This file runs embedded in-memory shards, for trying rain out.

import (
	"fmt"

	"rain/internal/shard"

	"github.com/alicebob/miniredis/v2"
)

// shardSpecs parses --redis, or starts 4 embedded in-memory shards when it
// is empty. stop closes what was started.
func shardSpecs(redis string) (specs []shard.Spec, stop func(), err error) {
	if redis != "" {
		specs, err = shard.ParseSpecs(redis)
		return specs, func() {}, err
	}
	var mrs []*miniredis.Miniredis
	stop = func() {
		for _, m := range mrs {
			m.Close()
		}
	}
	for i := range 4 {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			stop()
			return nil, nil, fmt.Errorf("embedded shard: %w", err)
		}
		mrs = append(mrs, m)
		specs = append(specs, shard.Spec{Name: fmt.Sprintf("mem%d", i+1), Weight: 1, Addr: m.Addr()})
	}
	return specs, stop, nil
}
