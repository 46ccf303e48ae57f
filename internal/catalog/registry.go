package catalog

// This file is where pools are found: their records, the registry, and the
// serial shard's arbitration and repair.
//
// A lookup's name says whether it reads Redis (see the package's comment).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/lua"
)

// Cached returns the pool's record, from memory once it is open or closed
// (no I/O), read from Redis (Read) otherwise:
// a closed pool's record never changes again; an open pool's changes only
// by an end or a close, whose notice (internal/events) makes the instances
// Forget it at once, and which moves every shard's life counter, so that
// a process that missed the notice (or hears none: rain settle) forgets
// every open record at its next registry read (ReadList, every 2 s while
// work goes on): no record is read again while nothing happens. A pool
// loading or closing is read again on every call. ErrNotFound for no such
// pool; ErrUnavailable when it cannot be read now.
func (c *Catalog) Cached(ctx context.Context, id string) (*rain.Pool, error) {
	c.mu.RLock()
	p := c.records[id]
	c.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	p, err := c.Read(ctx, id)
	if err != nil {
		return nil, err
	}
	if p.State == rain.Open || p.State == rain.Closed {
		c.mu.Lock()
		c.keep(id, p)
		c.mu.Unlock()
	}
	return p, nil
}

// closedKept bounds the closed pools' records kept in memory: a season's
// closed pools would otherwise stay for the life of the process. One that
// left is read again when asked for (its record stays on the shards).
const closedKept = 1024

// keep keeps p, id's record, in memory; past c.kept closed records, another
// closed one leaves. c.mu is held.
func (c *Catalog) keep(id string, p *rain.Pool) {
	c.drop(id)
	c.records[id] = p
	if p.State != rain.Closed {
		return
	}
	c.closedIDs[id] = true
	c.closed++
	for other, q := range c.records {
		if c.closed <= c.kept {
			break
		}
		if other != id && q.State == rain.Closed {
			c.drop(other)
		}
	}
}

// drop forgets id's record. c.mu is held.
func (c *Catalog) drop(id string) {
	if p := c.records[id]; p != nil && p.State == rain.Closed {
		c.closed--
	}
	delete(c.records, id)
}

// Forget drops what the catalogue keeps in memory of the pool: its life
// moved on (a close, seen here or through the notice of another instance).
func (c *Catalog) Forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(id)
}

// lifeKey counts, on every shard, the times a pool's life moved on there
// (an open, an end, a close): a process that sees it move forgets the open
// records it keeps.
const lifeKey = "rain:life"

// moved says, on every shard, that a pool's life moved on: its life
// counter rises (an error is logged; the notice, and the next close or
// open, cover it).
func (c *Catalog) moved(ctx context.Context, id string) {
	for _, name := range c.shards.Names() {
		if err := c.shards.Client(name).Incr(ctx, lifeKey).Err(); err != nil {
			c.log.Warn("a shard's life counter was not moved; instances that missed the notice keep the pool's record until the next move",
				"pool_id", id, "shard", name, "err", err)
		}
	}
}

// forgetOpen drops every open record kept: a shard's life counter moved.
func (c *Catalog) forgetOpen() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, p := range c.records {
		if p.State == rain.Open {
			c.drop(id)
		}
	}
}

// copyOf is one shard's copy of a pool's record, as Read reads it.
type copyOf struct {
	shard  string
	fields map[string]string // nil: none there
	r      *record           // parsed; nil when none or not whole
	err    error             // the shard did not answer
}

// Read reads the pool's record from Redis, every shard at once, and returns the
// copy furthest along the pool's life: the serial shard's decides which
// pool the id is (what is stored there wins a preload's race), and a copy
// of that same pool further along (a close writes the shards in turn; a
// shard may have lost writes) gives its state and account. Every copy that
// is missing, partial or behind is written back from it (never back: see
// lua.PutRecord), so a shard that lost its data never hides a pool, reopens
// a closed one or drops its account. ErrNotFound when no shard that
// answered has it; ErrUnavailable when none has a whole copy and some did
// not answer, or none of the copies is whole.
func (c *Catalog) Read(ctx context.Context, id string) (*rain.Pool, error) {
	r, err := c.readRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	return &r.Pool, nil
}

// readRecord is Read, with the record as stored.
func (c *Catalog) readRecord(ctx context.Context, id string) (*record, error) {
	names := c.shards.Names()
	copies := make([]copyOf, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			copies[i].shard = name
			m, err := c.shards.Client(name).HGetAll(ctx, recordKey(id)).Result()
			if err != nil {
				copies[i].err = fmt.Errorf("shard %s: %w", name, err)
				return
			}
			if len(m) > 0 {
				copies[i].fields = m
				copies[i].r, _ = parseRecord(m) // a part of a record is written back whole
			}
		})
	}
	wg.Wait()
	best := furthest(copies, c.serial)
	if best == nil {
		var down []error
		some := false
		for _, cp := range copies {
			if cp.err != nil {
				down = append(down, cp.err)
			}
			some = some || cp.fields != nil
		}
		switch {
		case some:
			return nil, rain.Errorf(rain.ErrUnavailable, nil, "pool %s: no shard holds a whole copy of its record", id)
		case len(down) > 0:
			return nil, rain.Errorf(rain.ErrUnavailable, errors.Join(down...), "pool %s: %s", id, downShards(copies))
		}
		return nil, rain.ErrNotFound
	}
	for _, cp := range copies {
		if cp.err == nil && (cp.r == nil || cp.r.State.Before(best.State) || cp.r.Account == nil && best.Account != nil) &&
			(cp.r == nil || cp.r.same(best)) {
			if _, err := c.putRecord(ctx, c.shards.Client(cp.shard), id, best.fields()); err != nil {
				c.log.Warn("a shard's copy of a pool record is missing or behind; writing it back failed, trying again at the next read",
					"pool_id", id, "shard", cp.shard, "err", err)
			}
		}
	}
	return best, nil
}

// downShards says which shards of copies did not answer.
func downShards(copies []copyOf) string {
	var names []string
	for _, cp := range copies {
		if cp.err != nil {
			names = append(names, cp.shard)
		}
	}
	if len(names) == 1 {
		return "shard " + names[0] + " did not answer"
	}
	return "shards " + strings.Join(names, ", ") + " did not answer"
}

// furthest is the record Read returns of the copies: the serial shard's
// pool (or, when it has no whole copy, the first whole copy's), at the
// furthest stage any copy of that same pool is at, with the account of
// that copy. Nil when no copy is whole.
func furthest(copies []copyOf, serial string) *record {
	var best *record
	for _, cp := range copies {
		if cp.r != nil && cp.shard == serial {
			best = cp.r
		}
	}
	for _, cp := range copies {
		switch {
		case cp.r == nil:
		case best == nil:
			best = cp.r
		case cp.r.same(best) && (best.State.Before(cp.r.State) || best.Account == nil && cp.r.Account != nil):
			best = cp.r
		}
	}
	return best
}

// putRecord writes the record where none is whole, or moves the stored one
// on to its state (never back), atomically, and returns what is stored.
func (c *Catalog) putRecord(ctx context.Context, client redis.UniversalClient, pool string, fields map[string]string) (*record, error) {
	m, _, err := lua.PutRecord(ctx, client, recordKey(pool), fields)
	if err != nil {
		return nil, rain.Errorf(rain.ErrUnavailable, err, "write pool record")
	}
	return parseRecord(m)
}

// ReadList reads from Redis the ids of every pool loaded, sorted: the union
// of every shard's registry, read at once (every preload writes every
// shard's). The
// union, not the serial shard's alone: a serial shard that lost its data (a
// restart without its AOF) answers with an empty registry, and a live pool
// must not vanish behind it; ReadList writes what it lacks back to it (see
// repair). When some shards do not answer it returns what the others hold,
// with ErrPartial (the list may then lack a pool only those hold);
// ErrUnavailable when none answers.
func (c *Catalog) ReadList(ctx context.Context) ([]string, error) {
	names := c.shards.Names()
	lists := make([][]string, len(names))
	lives := make([]string, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { lists[i], lives[i], errs[i] = c.readRegistry(ctx, name) })
	}
	wg.Wait()
	c.sawLives(names, lives, errs)
	c.mu.Lock()
	for i, name := range names {
		if errs[i] == nil {
			c.regs[name] = lists[i]
		}
	}
	c.mu.Unlock()
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
		return nil, rain.Errorf(rain.ErrUnavailable, joined, "list the pools: no shard answered")
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
		return ids, fmt.Errorf("%w: %w", rain.ErrPartial, joined)
	}
	c.listed.Store(&listing{ids: ids, at: time.Now()})
	return ids, nil
}

// sawLives compares the shards' life counters with those seen before, and
// forgets the open records kept when one moved.
func (c *Catalog) sawLives(names, lives []string, errs []error) {
	c.mu.Lock()
	moved := false
	for i, name := range names {
		if errs[i] != nil {
			continue
		}
		if prev, seen := c.lives[name]; seen && prev != lives[i] {
			moved = true
		}
		c.lives[name] = lives[i]
	}
	c.mu.Unlock()
	if moved {
		c.forgetOpen()
	}
}

// repair gives the serial shard back what it lacks of pools the other
// shards hold (it lost its data): each pool's record (written only where
// none is, so a record it has wins) and its registry entry. A failure is
// logged and tried again at the next ReadList.
func (c *Catalog) repair(ctx context.Context, missing []string) {
	for _, id := range missing {
		p, err := c.Read(ctx, id) // restores the serial shard's record
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
