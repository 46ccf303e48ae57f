package catalog

// This file is where pools are found: their records, the registry, and the
// serial shard's arbitration and repair.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/lua"
)

// Pool returns the pool's record, from memory once it is open or closed:
// neither changes but by a close (whose notice, internal/events, makes the
// instances Forget it), so the grab path reads it once. A pool loading or
// closing is read again on every call. ErrNotFound for no such pool;
// ErrUnavailable when it cannot be read now.
func (c *Catalog) Pool(ctx context.Context, id string) (*Pool, error) {
	c.mu.RLock()
	p := c.records[id]
	c.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	p, err := c.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	if p.State == Open || p.State == Closed {
		c.mu.Lock()
		c.records[id] = p
		c.mu.Unlock()
	}
	return p, nil
}

// Forget drops what the catalogue keeps in memory of the pool: its life
// moved on (a close, seen here or through the notice of another instance).
func (c *Catalog) Forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.records, id)
}

// Find reads the pool's record: the serial shard's, which decides, or, when
// the serial shard has none, the other shards' (the copy furthest along the
// pool's life: a preload opens the record on each shard in turn, a close
// closes it on each in turn). A record the other shards hold and a serial
// shard that answered lacks (it lost its data) is written back to it, where
// none is, so the pool never vanishes behind it. ErrNotFound when no shard that answered has it; ErrUnavailable
// when none has it and some did not answer.
func (c *Catalog) Find(ctx context.Context, id string) (*Pool, error) {
	key := recordKey(id)
	m, err := c.shards.Client(c.serial).HGetAll(ctx, key).Result()
	if err == nil && len(m) > 0 {
		return parseRecord(m)
	}
	var down []error
	if err != nil {
		down = append(down, fmt.Errorf("serial shard %s: %w", c.serial, err))
	}
	serialEmpty := err == nil
	var found map[string]string
	for _, name := range c.shards.Names() {
		if name == c.serial {
			continue
		}
		o, err := c.shards.Client(name).HGetAll(ctx, key).Result()
		if err != nil {
			down = append(down, fmt.Errorf("shard %s: %w", name, err))
			continue
		}
		if len(o) > 0 && (found == nil || State(o["state"]).stage() > State(found["state"]).stage()) {
			found = o
		}
	}
	if found == nil {
		if len(down) > 0 {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(down...))
		}
		return nil, ErrNotFound
	}
	if serialEmpty {
		if stored, err := c.putRecord(ctx, c.shards.Client(c.serial), id, found); err == nil {
			return stored, nil // what is stored there wins, written meanwhile or now
		}
	}
	return parseRecord(found)
}

// putRecord writes the record unless one is there, atomically, and returns
// what is stored: what is stored wins.
func (c *Catalog) putRecord(ctx context.Context, client *redis.Client, pool string, fields map[string]string) (*Pool, error) {
	m, err := lua.PutRecord(ctx, client, recordKey(pool), fields)
	if err != nil {
		return nil, fmt.Errorf("%w: write pool record: %w", ErrUnavailable, err)
	}
	return parseRecord(m)
}

// List returns the ids of every pool loaded, sorted: the union of every
// shard's registry, read at once (every preload writes every shard's). The
// union, not the serial shard's alone: a serial shard that lost its data (a
// restart without its AOF) answers with an empty registry, and a live pool
// must not vanish behind it; List writes what it lacks back to it (see
// repair). When some shards do not answer it returns what the others hold,
// with ErrPartial (the list may then lack a pool only those hold);
// ErrUnavailable when none answers.
func (c *Catalog) List(ctx context.Context) ([]string, error) {
	names := c.shards.Names()
	lists := make([][]string, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			if lists[i], errs[i] = c.shards.Client(name).SMembers(ctx, registryKey).Result(); errs[i] != nil {
				errs[i] = fmt.Errorf("shard %s: %w", name, errs[i])
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	var ids []string
	var atSerial map[string]bool
	answered := 0
	for i, name := range names {
		if errs[i] != nil {
			continue
		}
		answered++
		if name == c.serial {
			atSerial = make(map[string]bool, len(lists[i]))
			for _, id := range lists[i] {
				atSerial[id] = true
			}
		}
		for _, id := range lists[i] {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	joined := errors.Join(errs...)
	if answered == 0 {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, joined)
	}
	slices.Sort(ids)
	if atSerial != nil {
		var missing []string
		for _, id := range ids {
			if !atSerial[id] {
				missing = append(missing, id)
			}
		}
		c.repair(ctx, missing)
	}
	if joined != nil {
		return ids, fmt.Errorf("%w: %w", ErrPartial, joined)
	}
	c.listed.Store(&listing{ids: ids, at: time.Now()})
	return ids, nil
}

// repair gives the serial shard back what it lacks of pools the other
// shards hold (it lost its data): each pool's record (written only where
// none is, so a record it has wins) and its registry entry. A failure is
// logged and tried again at the next List.
func (c *Catalog) repair(ctx context.Context, missing []string) {
	for _, id := range missing {
		p, err := c.Find(ctx, id) // restores the serial shard's record
		if err == nil {
			err = c.shards.Client(c.serial).SAdd(ctx, registryKey, id).Err()
		}
		if err != nil {
			c.log.Warn("the serial shard lacks a pool the other shards hold; restoring it failed, trying again at the next registry read",
				"pool_id", id, "shard", c.serial, "err", err)
			continue
		}
		c.log.Warn("the serial shard lacked a pool the other shards hold (did it lose its data?); restored its record and registry entry",
			"pool_id", id, "shard", c.serial, "state", p.State)
	}
}
