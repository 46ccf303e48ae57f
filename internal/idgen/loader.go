package idgen

// This file is the loader: the one goroutine that reserves the next
// segment in the background, and the step that adapts to the rate.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// needLoad reports whether the buffer is empty and the current segment has
// reached its trigger, i.e. the next segment is wanted.
func (g *Generator) needLoad() bool {
	if g.next.Load() != nil {
		return false
	}
	s := g.cur.Load()
	return s.pos.Load() >= s.trigger
}

// loader is the only goroutine that calls the allocator, so there is never
// more than one load at a time.
// Its context ends with Close, so an Alloc in flight returns.
func (g *Generator) loader(ctx context.Context) {
	defer close(g.done)
	backoff := g.cfg.MinBackoff
	for {
		select {
		case <-g.stop:
			return
		case <-g.kick:
		}
		for g.needLoad() {
			err := g.load(ctx)
			g.broadcast()
			if err == nil {
				backoff = g.cfg.MinBackoff
				continue
			}
			// Full jitter keeps many instances from retrying in step.
			d := backoff/2 + rand.N(backoff/2+1)
			backoff = min(backoff*2, g.cfg.MaxBackoff)
			t := time.NewTimer(d)
			select {
			case <-g.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// broadcast wakes every Next waiting in stall.
func (g *Generator) broadcast() {
	w := make(chan struct{})
	old := g.wake.Swap(&w)
	close(*old)
}

// load reserves one segment and buffers it as next. A refused segment is
// followed at once by one catch-up request sized to pass the guard.
func (g *Generator) load(ctx context.Context) error {
	err := g.loadOnce(ctx)
	if errors.Is(err, ErrBackwards) {
		err = g.loadOnce(ctx)
	}
	g.down.Store(err != nil)
	return err
}

func (g *Generator) loadOnce(ctx context.Context) error {
	g.mu.Lock()
	step, extra := g.step, g.catchUp
	g.mu.Unlock()

	actx, cancel := context.WithTimeout(ctx, g.cfg.LoadTimeout)
	end, err := g.alloc.Alloc(actx, step+extra)
	cancel()

	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.loadErrors.Add(1)
		g.lastError = err
		return err
	}
	start := end - step + 1
	if start <= g.highest {
		// The counter is behind what this generator already reserved: the
		// range may have been served before. Never serve it; ask next time
		// for enough more to land past highest.
		g.refusals.Add(1)
		g.lastError = fmt.Errorf("%w: segment [%d, %d] starts at or below %d", ErrBackwards, start, end, g.highest)
		g.catchUp = max(0, g.highest-end)
		return g.lastError
	}
	g.catchUp = 0

	now := g.cfg.Now()
	if !g.lastLoad.IsZero() {
		switch lasted := now.Sub(g.lastLoad); {
		case lasted < g.cfg.Target:
			g.step = min(g.step*2, g.cfg.MaxStep)
		case lasted > 2*g.cfg.Target:
			g.step = max(g.step/2, g.cfg.MinStep)
		}
	}
	g.lastLoad = now
	g.highest = end
	g.lastError = nil
	g.loads.Add(1)
	g.next.Store(newSegment(start, end, g.cfg.Threshold))
	return nil
}
