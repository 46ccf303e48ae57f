package catalog

// This file is preload: a pool's record, its split, its stock loaded into
// its sub-pools, in an order that a crash anywhere leaves resumable.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/events"
	"rain/internal/lua"
	"rain/internal/shard"
	"rain/internal/split"
)

// Preload tuning.
const (
	// batchSize is the amounts one load script call appends.
	batchSize = 1000
	// batchesPerTrip is how many load calls share one pipelined round trip.
	batchesPerTrip = 16
)

// Preload loads a pool, or finishes a preload of the same spec that died
// midway: it is idempotent on the pool id. It returns the pool's status and
// created = true when this call opened the pool.
//
// The order makes a crash at any point safe: the record (spec, seed,
// placement) is written first; each sub-pool is set up and its stock appended
// in numbered batches that apply exactly once; only when every sub-pool holds
// all its stock are they opened, and then the record. Until then grabs answer
// not_started. Running the same preload again resumes at the first missing
// batch; the seed in the record makes the split the same every time.
func (c *Catalog) Preload(ctx context.Context, in rain.Spec) (st *rain.Status, created bool, err error) {
	return c.PreloadProgress(ctx, in, nil)
}

// PreloadProgress is Preload that calls progress, when not nil, as the
// stock loads: packets loaded so far (those a resumed preload finds loaded
// included) and the pool's count. It is called from several goroutines,
// one per sub-pool, never at once.
func (c *Catalog) PreloadProgress(ctx context.Context, in rain.Spec, progress func(loaded, total int64)) (st *rain.Status, created bool, err error) {
	spec, err := in.Normalize()
	if err != nil {
		return nil, false, err
	}
	p, err := c.register(ctx, spec)
	if err != nil {
		return nil, false, err
	}
	if p.State != rain.Open {
		if created, err = c.fill(ctx, p, progress); err != nil {
			return nil, false, err
		}
	}
	st, err = c.Status(ctx, spec.PoolID)
	return st, created, err
}

// register finds the pool's record or writes it. The serial shard decides:
// the record is written there first, in one atomic step unless one is
// there, and what is stored there wins, so two concurrent preloads of one
// id, even from instances with different shard lists, end with one record.
func (c *Catalog) register(ctx context.Context, spec rain.Spec) (*record, error) {
	existing, err := c.readRecord(ctx, spec.PoolID)
	if err != nil && !errors.Is(err, rain.ErrNotFound) {
		return nil, err
	}
	if existing == nil {
		units, err := c.units(ctx)
		if err != nil {
			return nil, err
		}
		k := spec.SubPools
		if k == 0 {
			k = autoSubPools(spec.Count, len(units))
		}
		placement, salts, err := c.place(spec.PoolID, k, units)
		if err != nil {
			return nil, err
		}
		fresh := (&record{spec: canonical(spec), Pool: rain.Pool{Seed: rand.Uint64(), Placement: placement, Salts: salts,
			State: rain.Loading}}).fields()
		if existing, err = c.putRecord(ctx, c.shards.Client(c.serial), spec.PoolID, fresh); err != nil {
			return nil, err
		}
	}
	if existing.State.Over() {
		return nil, closedErr(spec.PoolID, existing.State)
	}
	if existing.spec != canonical(spec) {
		return nil, rain.Errorf(rain.ErrConflict, nil, "pool %s exists as %s", spec.PoolID, existing.spec)
	}
	for j, name := range existing.Placement {
		if c.shards.Client(name) == nil {
			return nil, rain.Errorf(rain.ErrUnavailable, nil, "pool %s sub-pool %d is on shard %s, which is not configured", spec.PoolID, j, name)
		}
	}
	// Copy the record to every shard that lacks it, and list the pool.
	fields := existing.fields()
	for _, name := range c.shards.Names() {
		client := c.shards.Client(name)
		if _, err := c.putRecord(ctx, client, spec.PoolID, fields); err != nil {
			return nil, err
		}
		if err := client.SAdd(ctx, registryKey, spec.PoolID).Err(); err != nil {
			return nil, rain.Errorf(rain.ErrUnavailable, err, "shard %s: list pool %s", name, spec.PoolID)
		}
	}
	return existing, nil
}

// unit is what a sub-pool is placed on: a shard, or one primary of a
// cluster shard (its primaries count as shards: a pool's sub-pools spread
// over them as over shards).
type unit struct {
	shard   string
	primary *shard.Primary // nil: the shard itself
}

// units lists the placement units, with a ring over them: each shard that
// is not a cluster, of its weight, and each primary of a cluster shard (as
// it stands now), of the cluster's weight. Without a cluster the ring is
// the shards' own, so placement is as it always was.
func (c *Catalog) units(ctx context.Context) (map[string]unit, error) {
	out := map[string]unit{}
	for _, name := range c.shards.Names() {
		if !c.shards.IsCluster(name) {
			out[name] = unit{shard: name}
			continue
		}
		ps, err := c.shards.Primaries(ctx, name)
		if err != nil {
			return nil, rain.Errorf(rain.ErrUnavailable, err, "the primaries of cluster shard %s", name)
		}
		for i := range ps {
			out[unitName(name, i)] = unit{shard: name, primary: &ps[i]}
		}
	}
	return out, nil
}

// unitName names primary i of cluster shard name on the placement ring.
// Shard names cannot hold two dots in a row, so it is no shard's name.
func unitName(name string, i int) string { return name + "..primary" + strconv.Itoa(i) }

// place chooses where k sub-pools go: distinct units walking the ring of
// units clockwise from the pool id, round-robin over them when k exceeds
// their number. A sub-pool on a cluster's primary gets the salt that puts
// its hash tag's slot on that primary (after a reshard it lives wherever
// its slot went); the others none.
func (c *Catalog) place(pool string, k int, units map[string]unit) (placement, salts []string, err error) {
	ring := c.shards.Ring()
	if len(units) != len(c.shards.Names()) {
		var specs []shard.Spec
		for name, u := range units {
			specs = append(specs, shard.Spec{Name: name, Weight: c.shards.Weight(u.shard), Addr: "unit:1"})
		}
		if ring, err = shard.NewRing(specs, 0); err != nil {
			return nil, nil, fmt.Errorf("the placement ring: %w", err)
		}
	}
	distinct := ring.Distinct(pool, k)
	placement, salts = make([]string, k), make([]string, k)
	for j := range placement {
		u := units[distinct[j%len(distinct)]]
		placement[j] = u.shard
		if u.primary != nil {
			if salts[j], err = saltFor(pool, j, *u.primary); err != nil {
				return nil, nil, err
			}
		}
	}
	return placement, salts, nil
}

// saltFor finds the salt that puts sub-pool j's hash tag on primary p:
// about as many tries as the cluster has primaries.
func saltFor(pool string, j int, p shard.Primary) (string, error) {
	for s := range 1 << 16 {
		salt := strconv.Itoa(s)
		if p.Owns(shard.Slot(rain.SubPool{Pool: pool, Index: j, Salt: salt}.Tag())) {
			return salt, nil
		}
	}
	return "", rain.Errorf(rain.ErrUnavailable, fmt.Errorf("primary %s", p.Addr), "no hash tag of pool %s sub-pool %d falls on its primary", pool, j)
}

// fill loads every sub-pool's stock, then opens them and the record. It
// says whether this call opened the record: of concurrent preloads of one
// pool, one (the pool's creation, the answer 201; the others find it
// loaded, 200), and a preload that finishes one that died midway. (None,
// when the reply to the call that opened it was lost and the call sent
// again: it then answers 200, the pool open all the same.)
func (c *Catalog) fill(ctx context.Context, p *record, progress func(loaded, total int64)) (opened bool, err error) {
	spec := p.Spec
	amounts, err := split.Amounts(rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15)),
		split.Spec{TotalCents: spec.TotalCents, Count: spec.Count, MinCents: spec.MinCents, MaxCents: spec.MaxCents})
	if err != nil {
		return false, rain.Errorf(rain.ErrInvalid, err, "%s", err)
	}
	counts := subPoolCounts(spec.Count, len(p.Placement))
	var mu sync.Mutex
	var loaded int64
	report := func(n int64) {
		if progress == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		loaded += n
		progress(loaded, spec.Count)
	}
	errs := make([]error, len(counts))
	var wg sync.WaitGroup
	var off int64
	for j, n := range counts {
		part := amounts[off : off+n]
		off += n
		wg.Go(func() { errs[j] = c.fillSubPool(ctx, &p.Pool, j, part, report) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	for j := range counts {
		sp := p.SubPool(j)
		ok, n, cents, err := lua.OpenSubPool(ctx, c.client(&p.Pool, j), sp)
		if err != nil {
			return false, loadErr(spec.PoolID, err)
		}
		if !ok {
			return false, rain.Errorf(rain.ErrUnavailable, nil, "sub-pool %d holds %d packets, %d cents after loading", j, n, cents)
		}
	}
	// The record opens only from loading (lua.PutRecord moves a record on,
	// never back): a preload that stalled past the pool's close leaves it
	// closed, and says so.
	open := *p
	open.State = rain.Open
	if opened, err = c.moveRecord(ctx, &open); err != nil {
		return false, err
	}
	if now, err := c.Read(ctx, spec.PoolID); err != nil {
		return false, err
	} else if now.State.Over() {
		return false, closedErr(spec.PoolID, now.State)
	}
	// Every instance learns the pool now; the registry refresh covers a
	// notice that is lost, within a second.
	if err := events.Publish(ctx, c.shards.Clients(), events.Event{Kind: events.Pool, Pool: spec.PoolID}); err != nil {
		c.log.Warn("preload notice not published on every shard; instances learn the pool at their next registry refresh",
			"pool_id", spec.PoolID, "err", err)
	}
	c.opened(spec.PoolID)
	return opened, nil
}

// fillSubPool sets up sub-pool j and appends its amounts from the first batch
// it lacks, batchesPerTrip batches of batchSize amounts per round trip.
// report is told how many more of its packets are loaded.
func (c *Catalog) fillSubPool(ctx context.Context, p *rain.Pool, j int, amounts []int64, report func(n int64)) error {
	client := c.client(p, j)
	sp := p.SubPool(j)
	var cents int64
	for _, a := range amounts {
		cents += a
	}
	state, next, err := lua.Setup(ctx, client, sp, int64(len(amounts)), cents, window(p.Spec))
	if err != nil {
		return loadErr(p.ID(), err)
	}
	if rain.State(state) != rain.Loading {
		report(int64(len(amounts)))
		return nil
	}
	if err := lua.LoadScripts(ctx, client); err != nil {
		return rain.Errorf(rain.ErrUnavailable, err, "load %s", sp.Tag())
	}
	batches := (int64(len(amounts)) + batchSize - 1) / batchSize
	done := min(next*batchSize, int64(len(amounts))) // packets loaded before
	report(done)
	for next < batches {
		pipe := client.Pipeline()
		var cmds []*redis.Cmd
		for b := next; b < batches && b < next+batchesPerTrip; b++ {
			lo, hi := b*batchSize, min((b+1)*batchSize, int64(len(amounts)))
			cmds = append(cmds, lua.LoadCmd(ctx, pipe, sp, b, amounts[lo:hi]))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return rain.Errorf(rain.ErrUnavailable, err, "load %s", sp.Tag())
		}
		for _, cmd := range cmds {
			res, n, err := lua.ParseLoad(cmd)
			if err != nil {
				return rain.Errorf(rain.ErrUnavailable, err, "load %s", sp.Tag())
			}
			switch res {
			case lua.AlreadyOpen:
				report(int64(len(amounts)) - done)
				return nil
			case lua.LoadClosed:
				return closedErr(p.ID(), rain.Closed)
			}
			next = n // loaded or skipped, the script says which batch comes next
		}
		now := min(next*batchSize, int64(len(amounts)))
		report(now - done)
		done = now
	}
	return nil
}

// loadErr is the error of a step of a preload on a sub-pool: the pool
// closed meanwhile (a preload that stalled past the close), the sub-pool
// there with another spec, or a shard that did not answer.
func loadErr(id string, err error) error {
	switch {
	case errors.Is(err, lua.ErrClosed):
		return closedErr(id, rain.Closed)
	case errors.Is(err, lua.ErrSpecMismatch):
		return rain.Errorf(rain.ErrConflict, err, "%s", err)
	}
	return rain.Errorf(rain.ErrUnavailable, err, "preload %s", id)
}

// closedErr says that a preload met its pool closed (or closing): nothing
// was written, and the id cannot be loaded again.
func closedErr(id string, s rain.State) error {
	return rain.Errorf(rain.ErrConflict, nil, "pool %s is %s: its id cannot be loaded again", id, s)
}

// client is the shard client of the pool's sub-pool j.
func (c *Catalog) client(p *rain.Pool, j int) redis.UniversalClient {
	return c.shards.Client(p.Placement[j])
}

// OnOpen has f told of every pool a preload through this catalog opens,
// before Preload returns: the instance's own grab path learns the pool
// before the notice to every instance comes back (internal/events).
func (c *Catalog) OnOpen(f func(poolID string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onOpen = append(c.onOpen, f)
}

// opened tells OnOpen's functions that the pool opened.
func (c *Catalog) opened(id string) {
	c.mu.RLock()
	fs := c.onOpen
	c.mu.RUnlock()
	for _, f := range fs {
		f(id)
	}
}
