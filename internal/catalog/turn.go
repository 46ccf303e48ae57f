package catalog

// This file reads the pool registries for background work one shard at a
// time: every preload writes every shard's registry, and registries only
// grow, so the union of each shard's latest read is the list, and an
// instance that keeps its list current costs each shard a read every
// (period × shards), not every period.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"rain"
)

// readRegistry reads one shard's registry and life counter ("" when it has
// none yet), in one round trip.
func (c *Catalog) readRegistry(ctx context.Context, name string) (ids []string, life string, err error) {
	pipe := c.shards.Client(name).Pipeline()
	members := pipe.SMembers(ctx, registryKey)
	lifeCmd := pipe.Get(ctx, lifeKey)
	_, _ = pipe.Exec(ctx)
	life, _ = lifeCmd.Result()
	if ids, err = members.Result(); err != nil {
		return nil, life, fmt.Errorf("shard %s: %w", name, err)
	}
	return ids, life, nil
}

// ReadListInTurn is ReadList for a caller that lists again and again (the
// known pools' refresh): it reads from Redis the registry and life counter
// of one shard, the
// shards in turn, and returns the union of every shard's latest read,
// sorted. Until every shard has been read once it reads them all (ReadList).
// A pool preloaded anywhere is in the list after at most one read (every
// shard's registry has it); an end or close anywhere moves every shard's
// life counter. When the shard in turn does not answer it returns the union
// as it stands, with ErrPartial. Reading the serial shard, it gives it back
// what it lacks of the others' (see ReadList).
func (c *Catalog) ReadListInTurn(ctx context.Context) ([]string, error) {
	names := c.shards.Names()
	c.mu.Lock()
	whole := len(c.regs) == len(names)
	name := names[c.turn%len(names)]
	c.turn++
	c.mu.Unlock()
	if !whole {
		return c.ReadList(ctx)
	}
	ids, life, err := c.readRegistry(ctx, name)
	c.sawLives([]string{name}, []string{life}, []error{err})
	c.mu.Lock()
	if err == nil {
		c.regs[name] = ids
	}
	seen := map[string]bool{}
	var union []string
	for _, reg := range c.regs {
		for _, id := range reg {
			if !seen[id] {
				seen[id] = true
				union = append(union, id)
			}
		}
	}
	c.mu.Unlock()
	slices.Sort(union)
	if err != nil {
		return union, fmt.Errorf("%w: %w", rain.ErrPartial, err)
	}
	if name == c.serial {
		have := make(map[string]bool, len(ids))
		for _, id := range ids {
			have[id] = true
		}
		var missing []string
		for _, id := range union {
			if !have[id] {
				missing = append(missing, id)
			}
		}
		c.repair(ctx, missing)
	}
	c.listed.Store(&listing{ids: union, at: time.Now()})
	return union, nil
}
