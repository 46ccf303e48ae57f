package grab

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	ids, err := s.poolIDs(ctx)
	if err != nil {
		return nil, err
	}
	var out []SubPoolRef
	var errs []error
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

// poolIDs lists every pool: the arbiter's registry, which every preload
// writes first (one call, whatever the number of shards), or, while the
// arbiter does not answer, the union of the other shards' registries.
func (s *Service) poolIDs(ctx context.Context) ([]string, error) {
	ids, err := s.shards.Client(s.arbiter).SMembers(ctx, registryKey).Result()
	if err == nil {
		return ids, nil
	}
	errs := []error{fmt.Errorf("arbiter %s: %w", s.arbiter, err)}
	seen := map[string]bool{}
	answered := false
	for _, name := range s.shards.Names() {
		if name == s.arbiter {
			continue
		}
		members, err := s.shards.Client(name).SMembers(ctx, registryKey).Result()
		if err != nil {
			errs = append(errs, fmt.Errorf("shard %s: %w", name, err))
			continue
		}
		answered = true
		for _, id := range members {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	if !answered {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(errs...))
	}
	return ids, nil
}

// poolList is the pools as Run's refresh last listed them, with the open
// pools this instance has met since (a pool preloaded a moment ago is not
// in the list yet), when Run runs; else it lists them now.
func (s *Service) poolList(ctx context.Context) ([]string, error) {
	listed := s.listed.Load()
	if listed == nil {
		return s.poolIDs(ctx)
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

// refreshList lists the pools and keeps the list for poolList; it is what
// Run's registry refresh calls.
func (s *Service) refreshList(ctx context.Context) ([]string, error) {
	ids, err := s.poolIDs(ctx)
	if err == nil {
		cp := slices.Clone(ids)
		s.listed.Store(&cp)
	}
	return ids, err
}
