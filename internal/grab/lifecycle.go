package grab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"rain/internal/lua"
)

// Errors of Confirm.
var (
	// ErrGrantReleased is returned when the grant was released at its
	// deadline before it was confirmed: its amount is back in the stock.
	ErrGrantReleased = errors.New("grant was released")
	// ErrSerialMismatch is returned when the user's grant has another serial.
	ErrSerialMismatch = errors.New("serial does not match the user's grant")
	// ErrNoGrant is returned when the user holds no grant in the pool.
	ErrNoGrant = errors.New("no such grant")
)

// Confirm marks the user's held grant with serial as confirmed: settlement
// has paid it, and it will never be released. Confirming a confirmed grant
// again succeeds. It returns ErrNotFound for an unknown pool, ErrNoGrant,
// ErrGrantReleased or ErrSerialMismatch.
func (s *Service) Confirm(ctx context.Context, poolID, userID string, serial int64) error {
	p, err := s.pool(ctx, poolID)
	if err != nil {
		return err
	}
	j := home(userID, len(p.keys))
	res, err := lua.Confirm(ctx, p.clients[j], &p.keys[j], userID, serial)
	if err != nil {
		return fmt.Errorf("%w: confirm %s sub-pool %d: %w", ErrUnavailable, poolID, j, err)
	}
	return confirmErr(res)
}

// confirmErr maps a confirm script result to Confirm's errors.
func confirmErr(res lua.Confirmation) error {
	switch res {
	case lua.Confirmed, lua.AlreadyConfirmed:
		return nil
	case lua.WasReleased:
		return ErrGrantReleased
	case lua.SerialMismatch:
		return ErrSerialMismatch
	default:
		return ErrNoGrant
	}
}

// releaseBatch is the most grants one release script call handles, so no
// call blocks a shard for long.
const releaseBatch = 500

// Sweep is what one ReleaseExpired pass did.
type Sweep struct {
	Released, ReleasedCents int64
	// OldestOverdue is how long past its deadline the oldest overdue grant
	// was when the pass reached it: the reaper's lag.
	OldestOverdue time.Duration
}

// ReleaseExpired makes one pass over the sub-pools of every pool that may
// have work, and releases the grants still held past their deadline, in
// batches, and resolves spills in flight for too long. It stops at once,
// with ctx's error, when ctx ends; sub-pools it cannot reach are skipped and
// their errors returned, joined, with what it did. Each release is checked
// inside its script (still held, past the deadline by the shard's clock), so
// two passes at once, or a stale one, never release a grant twice.
//
// A pass skips a sub-pool until it may have work: each sweep learns from the
// shard how long until a grant there can next fall due (its earliest
// deadline, and at most the pool's hold, as a grant made later falls due no
// sooner) and until a spill in flight can next need resolving (at most
// spillAge). So an idle pool costs its shards two calls per sub-pool every
// spillAge, not every pass.
func (s *Service) ReleaseExpired(ctx context.Context) (Sweep, error) {
	var sw Sweep
	ids, err := s.poolList(ctx)
	errs := []error{err}
	now := time.Now()
	for _, id := range ids {
		p, err := s.pool(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err) // a shard down: the next pass retries
			continue
		}
		for j := range p.keys {
			if err := ctx.Err(); err != nil {
				return sw, err
			}
			sp := lua.SubPool{Pool: id, Index: j}
			if due, ok := s.sweepDue(sp); ok && now.Before(due) {
				continue
			}
			next, failed := s.spillAge, false
			if len(p.keys) > 1 {
				n, err := s.recoverSpills(ctx, p, j)
				if err != nil {
					errs = append(errs, fmt.Errorf("%w: recover spills of %s sub-pool %d: %w", ErrUnavailable, id, j, err))
					failed = true // swept again next pass; its releases go on
				}
				next = min(next, n)
			}
			for more := true; more; {
				if err := ctx.Err(); err != nil {
					return sw, err
				}
				r, err := lua.ReleaseExpired(ctx, p.clients[j], &p.keys[j], releaseBatch)
				if err != nil {
					errs = append(errs, fmt.Errorf("%w: release %s sub-pool %d: %w", ErrUnavailable, id, j, err))
					failed = true
					break
				}
				sw.Released += r.Count
				sw.ReleasedCents += r.Cents
				sw.OldestOverdue = max(sw.OldestOverdue, time.Duration(r.OldestOverdueMS)*time.Millisecond)
				more = r.More
				next = min(next, time.Duration(r.NextMS)*time.Millisecond)
			}
			if !failed {
				s.setSweepDue(sp, now.Add(next))
			}
		}
	}
	return sw, errors.Join(errs...)
}

// sweepDue is when sub-pool sp next needs a sweep; ok is false when it was
// never swept (by this instance).
func (s *Service) sweepDue(sp lua.SubPool) (time.Time, bool) {
	s.dueMu.Lock()
	defer s.dueMu.Unlock()
	t, ok := s.due[sp]
	return t, ok
}

func (s *Service) setSweepDue(sp lua.SubPool, t time.Time) {
	s.dueMu.Lock()
	defer s.dueMu.Unlock()
	s.due[sp] = t
}

// SubPoolRef names a sub-pool and the shard that holds it.
type SubPoolRef struct {
	lua.SubPool
	Shard string
}

// SubPools lists the sub-pools of every pool the shards' registries know,
// with their shards. Pools that cannot be read now (a shard down, or one not
// configured here) are left out and their errors returned, joined, beside
// the others.
func (s *Service) SubPools(ctx context.Context) ([]SubPoolRef, error) {
	ids, _, err := s.poolIDs(ctx)
	if ids == nil && err != nil {
		return nil, err
	}
	var out []SubPoolRef
	errs := []error{err} // a partial list: the pools of the shards that answered
	for _, id := range ids {
		p, err := s.pool(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, err) // skip it now, list the others
			continue
		}
		for j, name := range p.rec.placement {
			out = append(out, SubPoolRef{SubPool: lua.SubPool{Pool: id, Index: j}, Shard: name})
		}
	}
	return out, errors.Join(errs...)
}

// poolIDs lists every pool: the union of every shard's registry, read at
// once (every preload writes every shard's). The union, not the arbiter's
// alone: an arbiter that lost its data (a restart without its AOF) answers
// with an empty registry, and a live pool must not vanish behind it (see
// repairArbiter). It returns what the shards that answered hold, with
// errPartial wrapping the others' errors when some did not answer (the list
// may then lack a pool only those hold), or ErrUnavailable when none did.
// missing lists the ids the arbiter, having answered, lacks.
func (s *Service) poolIDs(ctx context.Context) (ids, missing []string, err error) {
	names := s.shards.Names()
	lists := make([][]string, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			if lists[i], errs[i] = s.shards.Client(name).SMembers(ctx, registryKey).Result(); errs[i] != nil {
				errs[i] = fmt.Errorf("shard %s: %w", name, errs[i])
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	var atArbiter map[string]bool
	answered := 0
	for i, name := range names {
		if errs[i] != nil {
			continue
		}
		answered++
		if name == s.arbiter {
			atArbiter = make(map[string]bool, len(lists[i]))
			for _, id := range lists[i] {
				atArbiter[id] = true
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
	switch {
	case answered == 0:
		return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, joined)
	case atArbiter != nil:
		for _, id := range ids {
			if !atArbiter[id] {
				missing = append(missing, id)
			}
		}
	}
	if joined != nil {
		return ids, missing, fmt.Errorf("%w: %w", errPartial, joined)
	}
	return ids, missing, nil
}

// errPartial is poolIDs' error when some shards did not answer: the ids it
// returns are those the others hold.
var errPartial = errors.New("some shards did not answer")

// repairArbiter gives the arbiter back what it lacks of pools the other
// shards hold (it lost its data): each pool's record (written only where
// none is, so a record the arbiter has won) and its registry entry. The
// registry refresh calls it; a failure is logged and tried again at the
// next refresh.
func (s *Service) repairArbiter(ctx context.Context, missing []string) {
	for _, id := range missing {
		rec, err := s.findRecord(ctx, id) // restores the arbiter's record
		if err == nil {
			err = s.shards.Client(s.arbiter).SAdd(ctx, registryKey, id).Err()
		}
		if err != nil {
			s.log.Warn("the serial shard lacks a pool the other shards hold; restoring it failed, trying again at the next refresh",
				"pool_id", id, "shard", s.arbiter, "err", err)
			continue
		}
		s.log.Warn("the serial shard lacked a pool the other shards hold (did it lose its data?); restored its record and registry entry",
			"pool_id", id, "shard", s.arbiter, "state", rec.state)
	}
}

// poolList is the pools as Run's refresh last listed them, with the open
// pools this instance has met since (a pool preloaded a moment ago is not
// in the list yet), when Run runs; else it lists them now.
func (s *Service) poolList(ctx context.Context) ([]string, error) {
	listed := s.listed.Load()
	if listed == nil {
		ids, _, err := s.poolIDs(ctx)
		return ids, err
	}
	ids := slices.Clone(*listed)
	s.mu.RLock()
	for id := range s.pools {
		if !slices.Contains(*listed, id) {
			ids = append(ids, id)
		}
	}
	s.mu.RUnlock()
	return ids, nil
}

// refreshList lists the pools and keeps the list for poolList, and
// repairs the arbiter's registry; it is what Run's registry refresh calls.
func (s *Service) refreshList(ctx context.Context) ([]string, error) {
	ids, missing, err := s.poolIDs(ctx)
	if err == nil {
		cp := slices.Clone(ids)
		s.listed.Store(&cp)
	}
	if len(missing) > 0 {
		s.repairArbiter(ctx, missing)
	}
	return ids, err
}
