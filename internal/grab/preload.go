package grab

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"rain/internal/known"
	"rain/internal/lua"
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
func (s *Service) Preload(ctx context.Context, in Spec) (st *Status, created bool, err error) {
	return s.PreloadProgress(ctx, in, nil)
}

// PreloadProgress is Preload that calls progress, when not nil, as the
// stock loads: packets loaded so far (those a resumed preload finds loaded
// included) and the pool's count. It is called from several goroutines,
// one per sub-pool, never at once.
func (s *Service) PreloadProgress(ctx context.Context, in Spec, progress func(loaded, total int64)) (st *Status, created bool, err error) {
	spec, err := in.Normalize()
	if err != nil {
		return nil, false, err
	}
	rec, err := s.register(ctx, spec)
	if err != nil {
		return nil, false, err
	}
	if rec.state != stateOpen {
		if err := s.fill(ctx, rec, progress); err != nil {
			return nil, false, err
		}
		created = true
	}
	st, err = s.Status(ctx, spec.PoolID)
	return st, created, err
}

// register finds the pool's record or writes it. The arbiter shard (the
// serial shard in rain serve) decides: the record is written there first, in
// one atomic step unless one is there, and what is stored there wins, so two
// concurrent preloads of one id, even from instances with different shard
// lists, end with one record.
func (s *Service) register(ctx context.Context, spec Spec) (*record, error) {
	existing, err := s.findRecord(ctx, spec.PoolID)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if existing == nil {
		k := spec.SubPools
		if k == 0 {
			k = autoSubPools(spec.Count, len(s.shards.Names()))
		}
		fresh := map[string]string{
			"spec":      spec.canonical(),
			"seed":      strconv.FormatUint(rand.Uint64(), 10),
			"placement": strings.Join(s.place(spec.PoolID, k), ","),
			"state":     stateLoading,
		}
		if existing, err = s.putRecord(ctx, s.shards.Client(s.arbiter), spec.PoolID, fresh); err != nil {
			return nil, err
		}
	}
	if existing.specJSON != spec.canonical() {
		return nil, fmt.Errorf("%w: pool %s exists as %s", ErrConflict, spec.PoolID, existing.specJSON)
	}
	for j, name := range existing.placement {
		if s.shards.Client(name) == nil {
			return nil, fmt.Errorf("%w: pool %s sub-pool %d is on shard %s, which is not configured", ErrUnavailable, spec.PoolID, j, name)
		}
	}
	// Copy the record to every shard that lacks it, and list the pool.
	fields := map[string]string{
		"spec": existing.specJSON, "seed": strconv.FormatUint(existing.seed, 10),
		"placement": strings.Join(existing.placement, ","), "state": existing.state,
	}
	for _, name := range s.shards.Names() {
		c := s.shards.Client(name)
		if _, err := s.putRecord(ctx, c, spec.PoolID, fields); err != nil {
			return nil, err
		}
		if err := c.SAdd(ctx, registryKey, spec.PoolID).Err(); err != nil {
			return nil, fmt.Errorf("shard %s: %w: %w", name, ErrUnavailable, err)
		}
	}
	return existing, nil
}

// putRecord writes the record unless one is there, atomically, and returns
// what is stored: what is stored wins.
func (s *Service) putRecord(ctx context.Context, c *redis.Client, pool string, fields map[string]string) (*record, error) {
	m, err := lua.PutRecord(ctx, c, recordKey(pool), fields)
	if err != nil {
		return nil, fmt.Errorf("%w: write pool record: %w", ErrUnavailable, err)
	}
	return parseRecord(m)
}

// place chooses the shards of k sub-pools: distinct shards walking the ring
// clockwise from the pool id, round-robin over them when k exceeds the
// number of shards.
func (s *Service) place(pool string, k int) []string {
	distinct := s.shards.Ring().Distinct(pool, k)
	out := make([]string, k)
	for j := range out {
		out[j] = distinct[j%len(distinct)]
	}
	return out
}

// fill loads every sub-pool's stock, then opens them and the record.
func (s *Service) fill(ctx context.Context, rec *record, progress func(loaded, total int64)) error {
	spec := rec.spec
	amounts, err := split.Amounts(rand.New(rand.NewPCG(rec.seed, rec.seed^0x9e3779b97f4a7c15)),
		split.Spec{TotalCents: spec.TotalCents, Count: spec.Count, MinCents: spec.MinCents, MaxCents: spec.MaxCents})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	counts := subPoolCounts(spec.Count, len(rec.placement))
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
		wg.Go(func() { errs[j] = s.fillSubPool(ctx, rec, j, part, report) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for j := range counts {
		sp := lua.SubPool{Pool: spec.PoolID, Index: j}
		opened, n, cents, err := lua.OpenSubPool(ctx, s.client(rec, j), sp)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if !opened {
			return fmt.Errorf("sub-pool %d holds %d packets, %d cents after loading: %w", j, n, cents, ErrUnavailable)
		}
	}
	for _, name := range s.shards.Names() {
		if err := s.shards.Client(name).HSet(ctx, recordKey(spec.PoolID), "state", stateOpen).Err(); err != nil {
			return fmt.Errorf("shard %s: %w: %w", name, ErrUnavailable, err)
		}
	}
	// Every instance learns the pool now; the registry refresh covers a
	// notice that is lost, within a second.
	if err := known.Publish(ctx, s.shards.Clients(), spec.PoolID); err != nil {
		s.log.Warn("preload notice not published on every shard; instances learn the pool at their next registry refresh",
			"pool_id", spec.PoolID, "err", err)
	}
	s.known.Add(spec.PoolID)
	return nil
}

// fillSubPool sets up sub-pool j and appends its amounts from the first batch
// it lacks, batchesPerTrip batches of batchSize amounts per round trip.
// report is told how many more of its packets are loaded.
func (s *Service) fillSubPool(ctx context.Context, rec *record, j int, amounts []int64, report func(n int64)) error {
	c := s.client(rec, j)
	sp := lua.SubPool{Pool: rec.spec.PoolID, Index: j}
	var cents int64
	for _, a := range amounts {
		cents += a
	}
	state, next, err := lua.Setup(ctx, c, sp, int64(len(amounts)), cents, rec.spec.window())
	if err != nil {
		if errors.Is(err, lua.ErrSpecMismatch) {
			return fmt.Errorf("%w: %w", ErrConflict, err)
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if state != stateLoading {
		report(int64(len(amounts)))
		return nil
	}
	if err := lua.LoadScripts(ctx, c); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	batches := (int64(len(amounts)) + batchSize - 1) / batchSize
	done := min(next*batchSize, int64(len(amounts))) // packets loaded before
	report(done)
	for next < batches {
		pipe := c.Pipeline()
		var cmds []*redis.Cmd
		for b := next; b < batches && b < next+batchesPerTrip; b++ {
			lo, hi := b*batchSize, min((b+1)*batchSize, int64(len(amounts)))
			cmds = append(cmds, lua.LoadCmd(ctx, pipe, sp, b, amounts[lo:hi]))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("%w: load %s: %w", ErrUnavailable, sp.Tag(), err)
		}
		for _, cmd := range cmds {
			res, n, err := lua.ParseLoad(cmd)
			if err != nil {
				return fmt.Errorf("%w: load %s: %w", ErrUnavailable, sp.Tag(), err)
			}
			if res == lua.AlreadyOpen {
				report(int64(len(amounts)) - done)
				return nil
			}
			next = n // loaded or skipped, the script says which batch comes next
		}
		now := min(next*batchSize, int64(len(amounts)))
		report(now - done)
		done = now
		if s.afterTrip != nil {
			if err := s.afterTrip(j, next); err != nil {
				return err
			}
		}
	}
	return nil
}
