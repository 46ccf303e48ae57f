package grab

import (
	"context"
	"fmt"

	"rain/internal/lua"
)

// spill takes an amount for userID from a sibling of their empty home
// sub-pool h, by the crash-safe protocol of DESIGN.md: the claim at h has
// recorded a reservation (token, h's clock); take at sibling j moves an
// amount into an in-flight transfer; adopt at h turns the reservation into a
// held grant, only while it is younger than T; ack at j drops the transfer.
// A stale reservation means untake at j; no sibling with stock means abort
// at h and sold out. Each step is one idempotent script on one shard, and the
// reaper finishes or undoes whatever a crash leaves (ReleaseExpired).
// Dedup stays at h: the user can never get two grants.
func (s *Service) spill(ctx context.Context, p *pool, userID string, h int, serial int64, token string) (lua.Claim, error) {
	id := p.rec.spec.PoolID
	k := len(p.keys)
	valid := s.spillValidity.Milliseconds()
	s.empty.MarkEmpty(id, h)
	for step := 1; step < k; step++ {
		j := (h + step) % k
		if s.empty.Empty(id, j) {
			continue // answered empty within the last second, no stock back since
		}
		amount, err := lua.Take(ctx, p.clients[j], &p.keys[j], token, h, userID)
		if err != nil {
			return lua.Claim{}, fmt.Errorf("%w: take from %s sub-pool %d: %w", ErrUnavailable, id, j, err)
		}
		if amount == 0 {
			s.empty.MarkEmpty(id, j)
			continue
		}
		if err := s.step("taken"); err != nil {
			return lua.Claim{}, err
		}
		c, ok, err := lua.Adopt(ctx, p.clients[h], &p.keys[h], userID, token, serial, amount, j, valid)
		if err != nil {
			return lua.Claim{}, fmt.Errorf("%w: adopt at %s sub-pool %d: %w", ErrUnavailable, id, h, err)
		}
		if !ok {
			// Too late: the reservation is older than T. Put the amount back;
			// if that fails too, the reaper does it.
			_, _ = lua.Untake(ctx, p.clients[j], &p.keys[j], token)
			return lua.Claim{}, fmt.Errorf("%w: spill for %s in %s took longer than %v", ErrUnavailable, userID, id, s.spillValidity)
		}
		if err := s.step("adopted"); err != nil {
			return lua.Claim{}, err
		}
		// The grant stands; a failed ack leaves the transfer to the reaper,
		// which finds the token in the home's adopted set and acks it.
		if _, err := lua.Ack(ctx, p.clients[j], &p.keys[j], token); err == nil {
			if err := s.step("acked"); err != nil {
				return lua.Claim{}, err
			}
			_ = lua.ForgetAdopted(ctx, p.clients[h], &p.keys[h], token)
		}
		return c, nil
	}
	if err := lua.Abort(ctx, p.clients[h], &p.keys[h], userID, token); err != nil {
		return lua.Claim{}, fmt.Errorf("%w: abort at %s sub-pool %d: %w", ErrUnavailable, id, h, err)
	}
	return lua.Claim{Outcome: lua.Empty}, nil
}

func (s *Service) step(name string) error {
	if s.spillHook == nil {
		return nil
	}
	return s.spillHook(name)
}

// recoverSpills drops expired reservations of sub-pool j and resolves its
// transfers old enough that no adopt can still succeed: the token in the
// home's adopted set means it was adopted (ack), anything else means it was
// not (untake). The adopted set outlives the grant (a release, a new grab),
// so the answer does not depend on what became of the grant.
func (s *Service) recoverSpills(ctx context.Context, p *pool, j int) error {
	_, stale, err := lua.StaleTransfers(ctx, p.clients[j], &p.keys[j], s.spillValidity.Milliseconds(), s.spillMargin.Milliseconds())
	if err != nil {
		return err
	}
	for _, t := range stale {
		if t.Home < 0 || t.Home >= len(p.keys) {
			return fmt.Errorf("transfer %s names home %d of %d sub-pools", t.Token, t.Home, len(p.keys))
		}
		adopted, err := lua.WasAdopted(ctx, p.clients[t.Home], &p.keys[t.Home], t.Token)
		if err != nil {
			return err
		}
		if !adopted {
			if _, err := lua.Untake(ctx, p.clients[j], &p.keys[j], t.Token); err != nil {
				return err
			}
			continue
		}
		if _, err := lua.Ack(ctx, p.clients[j], &p.keys[j], t.Token); err != nil {
			return err
		}
		if err := lua.ForgetAdopted(ctx, p.clients[t.Home], &p.keys[t.Home], t.Token); err != nil {
			return err
		}
	}
	return nil
}
