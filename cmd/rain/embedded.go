package main

// This file is the try-it mode of rain serve: with no --redis, embedded
// in-memory shards, for trying rain out.

import (
	"fmt"

	"rain/internal/shard"

	"github.com/alicebob/miniredis/v2"
)

// tryIt reports whether rain serve runs in the try-it mode, which no
// --redis asks for: on 4 embedded in-memory shards (miniredis), with a
// generated admin token, no user auth, settlement in process into a
// ledger file, no drain delay and no durability check. Everything is lost
// on exit: never for production. Every difference of the mode asks this.
func (c *serveConfig) tryIt() bool { return c.Redis == "" }

// shardSpecs parses --redis, or starts 4 embedded in-memory shards in the
// try-it mode. stop closes what was started.
func shardSpecs(c *serveConfig) (specs []shard.Spec, stop func(), err error) {
	if !c.tryIt() {
		specs, err = shard.ParseSpecs(c.Redis)
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
