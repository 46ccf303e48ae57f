package grab

import (
	"context"
	"errors"
	"fmt"

	"rain/internal/lua"
)

// spill takes an amount for userID from a sibling of their empty home
// sub-pool h, whose claim recorded a reservation under token, and grants it
// at h: the claim is Granted, Ended, or Empty when no sibling had stock; an
// error wraps ErrUnavailable or ErrOutcomeUnknown. The protocol, and why a
// crash or a lost reply anywhere in it loses or doubles nothing:
// docs/architecture.md#the-spill-protocol.
func (s *Service) spill(ctx context.Context, p *poolView, userID string, h int, serial int64, token string) (lua.Claim, error) {
	id := p.rec.ID()
	k := len(p.keys)
	s.local.empty.MarkEmpty(id, h)
	skipped := 0 // siblings whose shard is unavailable: no sold_out then
	for step := 1; step < k; step++ {
		j := (h + step) % k
		if s.local.empty.Empty(id, j) {
			continue // answered empty within the last second, no stock back since
		}
		if !s.usable(ctx, p, j) { // its breaker open, or a probe is out
			skipped++
			continue
		}
		tctx, cancel := s.stepContext(ctx)
		taken, amount, err := s.take(tctx, p, j, h, token, userID)
		cancel()
		if err != nil {
			// The amount may be in flight, or in a take no replica has
			// (a failover of j could give it back to j's stock while the
			// home granted it); no adopt was sent, so nothing is granted
			// under this token. Refuse it at home so the user may retry at
			// once; the reaper returns the amount.
			s.abort(ctx, p, userID, h, token, true)
			return lua.Claim{}, fmt.Errorf("%w: take from %s sub-pool %d: %w", ErrUnavailable, id, j, err)
		}
		switch taken {
		case lua.TakeEmpty:
			s.local.empty.MarkEmpty(id, j)
			continue
		case lua.TakeEnded:
			// The pool's window ended while this grab was spilling: nothing
			// was taken, nothing is granted.
			s.abort(ctx, p, userID, h, token, false)
			return lua.Claim{Outcome: lua.Ended}, nil
		case lua.TakeResolved, lua.TakeConflict:
			// A token this request has not used before: a serial handed out
			// twice, or a shard that lost writes. Take nothing under it.
			s.log.Error("spill token already used at a sibling", "pool_id", id, "sub_pool", j, "token", token, "user_id", userID, "resolved", taken == lua.TakeResolved)
			s.abort(ctx, p, userID, h, token, true)
			return lua.Claim{}, fmt.Errorf("%w: spill token %s of %s is already used at sub-pool %d", ErrUnavailable, token, id, j)
		}
		actx, cancel := s.stepContext(ctx)
		c, ok, err := s.adopt(actx, p, h, j, token, userID, serial, amount)
		cancel()
		if err != nil {
			// The adopt may have run, or a replica may lack it. Ask the
			// home for its verdict (which refuses the token if it has not
			// decided it), replicated: then we know.
			dctx, cancel := s.stepContext(ctx)
			v, derr := s.decide(dctx, p, h, token, userID)
			cancel()
			if derr != nil {
				return lua.Claim{}, fmt.Errorf("%w: adopt at %s sub-pool %d: %w", ErrOutcomeUnknown, id, h, errors.Join(err, derr))
			}
			if !v.Adopted || v.Origin != j || v.Amount != amount {
				s.resolve(ctx, p, j, token, false)
				return lua.Claim{}, fmt.Errorf("%w: adopt at %s sub-pool %d: %w", ErrUnavailable, id, h, err)
			}
			c, ok = lua.Claim{Outcome: lua.Granted, Amount: v.Amount, Serial: serial, DeadlineMS: v.DeadlineMS}, true
		}
		if !ok {
			// Refused: the window ended, the reservation is older than T, or
			// the user holds a grant. The amount goes back; if that fails
			// the reaper does it.
			s.resolve(ctx, p, j, token, false)
			if c.Outcome == lua.Ended {
				return c, nil
			}
			return lua.Claim{}, fmt.Errorf("%w: spill for %s in %s refused at home: its reservation lapsed (T = %v) or the user holds a grant", ErrUnavailable, userID, id, s.valid)
		}
		// The grant stands. A failed ack leaves the transfer to the reaper,
		// which reads the home's verdict and acks it.
		s.resolve(ctx, p, j, token, true)
		return c, nil
	}
	// No sibling had stock: nothing was taken, so nothing can be granted
	// under this token, and no adopt of it will ever be sent: the
	// reservation is dropped and nothing is recorded. If the abort fails,
	// the reservation lapses after T.
	s.abort(ctx, p, userID, h, token, false)
	if skipped > 0 {
		// Some sibling could not be asked: the pool may still have stock.
		return lua.Claim{}, fmt.Errorf("%w: %d sibling sub-pools of %s are on unavailable shards", ErrUnavailable, skipped, id)
	}
	return lua.Claim{Outcome: lua.Empty}, nil
}

// stepContext bounds one step of a spill by the shards' call budget.
func (s *Service) stepContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.shards.Timeout())
}

// take, adopt and decide run their spill step on the sub-pool's shard
// (see stepClient): with replicas, the step and a WAIT for one share a
// connection, and a step no replica has within half the budget is an error.
func (s *Service) take(ctx context.Context, p *poolView, j, h int, token, userID string) (lua.Taken, int64, error) {
	c, wait, err := s.stepClient(ctx, p, j)
	if err != nil {
		return 0, 0, err
	}
	// A transfer may now be in flight at j, whatever the answer: the
	// reaper's until the spill settles it, within the spill's age, however
	// late the grants held there fall due (see due.go).
	defer s.marks.markSooner(p.rec.Placement[j], p.keys[j].Meta)
	return lua.Take(ctx, c, &p.keys[j], token, h, userID, wait)
}

func (s *Service) adopt(ctx context.Context, p *poolView, h, j int, token, userID string, serial, amount int64) (lua.Claim, bool, error) {
	c, wait, err := s.stepClient(ctx, p, h)
	if err != nil {
		return lua.Claim{}, false, err
	}
	defer s.marks.mark(p.rec.Placement[h], p.keys[h].Meta) // a grant may now be held at h
	return lua.Adopt(ctx, c, &p.keys[h], userID, token, serial, amount, j, s.valid.Milliseconds(), wait)
}

func (s *Service) decide(ctx context.Context, p *poolView, h int, token, userID string) (lua.Verdict, error) {
	c, wait, err := s.stepClient(ctx, p, h)
	if err != nil {
		return lua.Verdict{}, err
	}
	return lua.Decide(ctx, c, &p.keys[h], token, userID, wait)
}

// abort drops the user's reservation at home h and, with refuse (an
// amount may be in flight under the token), refuses the token there;
// errors are logged: the reservation lapses after T by itself.
func (s *Service) abort(ctx context.Context, p *poolView, userID string, h int, token string, refuse bool) {
	ctx, cancel := s.stepContext(ctx)
	defer cancel()
	adopted, err := lua.Abort(ctx, p.clients[h], &p.keys[h], userID, token, refuse)
	switch {
	case err != nil:
		s.log.Debug("spill abort failed; the reservation lapses after T", "pool_id", p.rec.ID(), "sub_pool", h, "err", err)
	case adopted:
		s.log.Error("spill abort found the token adopted", "pool_id", p.rec.ID(), "sub_pool", h, "token", token)
	}
}

// resolve, the spill's last step, acks (the home adopted) or untakes (it
// refused) the transfer of token at sibling j. A failure is left to the
// reaper, which follows the home's verdict.
func (s *Service) resolve(ctx context.Context, p *poolView, j int, token string, adopted bool) {
	op, f := "untake", lua.Untake
	if adopted {
		op, f = "ack", lua.Ack
	}
	sctx, cancel := s.stepContext(ctx)
	defer cancel()
	res, err := f(sctx, p.clients[j], &p.keys[j], token)
	switch {
	case err != nil:
		s.log.Debug("spill "+op+" failed; the reaper finishes it", "pool_id", p.rec.ID(), "sub_pool", j, "token", token, "err", err)
	case res == lua.ResolveConflict || res == lua.NoTransfer:
		s.log.Error("spill "+op+" found the transfer resolved the other way, or gone", "pool_id", p.rec.ID(), "sub_pool", j, "token", token)
	}
}
