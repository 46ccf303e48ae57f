package settle

// This file is a pass that goes on without a batch that takes too long
// (Config.Patience): a sink that hangs for some grants (a lock in the
// database, a wallet that never answers one account) must not hold up the
// confirms of every other grant of the shard, which would then run out
// their hold and be released unpaid though their users were told granted.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxCalls bounds the calls to the sink in flight for one shard's grants,
// those of batches a pass went on without included: a sink that hangs for
// everyone has at most this many calls per shard waiting on it, and the
// passes meanwhile confirm their grants and put the deliveries off.
const maxCalls = 8

// settleOrGoOn settles msgs (settleBatch), waiting at most Config.Patience
// for it. A batch that takes longer runs on by itself: its entries are
// noted unsettled in p (or left for an operator, those that were) and
// skipped by later passes until it ends (shardLoop.running), and what it
// reports then is its own (its failed deliveries wait their retries, its
// acknowledgment is made when it ends).
func (w *Worker) settleOrGoOn(ctx context.Context, sh *shardLoop, stream string, msgs []redis.XMessage, p *pass) (failed bool) {
	// The entries of a batch still running (or that ended during this
	// pass) are its: this batch neither settles nor marks them.
	var mine []redis.XMessage
	for _, m := range msgs {
		if _, running := sh.running.Load(stream + " " + m.ID); running {
			w.skipped(p, stream, m.ID)
			continue
		}
		mine = append(mine, m)
	}
	if len(mine) == 0 {
		return false
	}
	msgs = mine
	var (
		mu       sync.Mutex
		finished bool
		left     bool // the pass went on without it
		own      pass // what the batch notes, merged into p if it ends in time
	)
	done := make(chan bool, 1)
	w.detached.Go(func() {
		f := w.settleBatch(ctx, sh, stream, msgs, &own)
		mu.Lock()
		finished = true
		if left {
			ended := sh.passes.Load() // a read of this pass may hold them still
			for _, m := range msgs {
				sh.running.CompareAndSwap(stream+" "+m.ID, int64(0), ended)
			}
			sh.slow.Add(-1)
			w.cfg.Logger.Info("settle: a batch the pass went on without ended", "stream", stream, "entries", len(msgs))
		}
		mu.Unlock()
		done <- f
	})
	t := time.NewTimer(w.cfg.Patience)
	defer t.Stop()
	select {
	case f := <-done:
		p.merge(&own)
		return f
	case <-t.C:
	}
	mu.Lock()
	defer mu.Unlock()
	if finished {
		f := <-done
		p.merge(&own)
		return f
	}
	left = true
	sh.slow.Add(1)
	for _, m := range msgs {
		sh.running.Store(stream+" "+m.ID, int64(0))
		w.skipped(p, stream, m.ID)
	}
	w.cfg.Logger.Warn("settle: a batch takes longer than the patience; the pass goes on without it",
		"shard", sh.name, "stream", stream, "entries", len(msgs), "patience", w.cfg.Patience, "running", sh.slow.Load())
	return false
}

// skipped notes in p an entry of a batch still running: unsettled, or left
// for an operator when it was (no lag: RainSettlementConflict says it
// waits).
func (w *Worker) skipped(p *pass, stream, id string) {
	if _, waits := w.awaitingOperator.Load(stream + " " + id); waits {
		p.leave(stream + " " + id)
		return
	}
	p.behind(id)
}

// places bounds a shard's calls to the sink in flight.
type places struct {
	ch chan struct{}
	// starved says a wait for a place ran out and none has been given
	// back since.
	starved atomic.Bool
}

func newPlaces(n int) *places { return &places{ch: make(chan struct{}, n)} }

// take takes a place, waiting at most patience for one to be free. It
// reports whether it took one; give gives it back. Once a wait has run
// out, later ones do not wait until a place is given back: batches
// settled one after another (a cluster shard's outboxes, the pages of a
// takeover) would otherwise each cost the pass a patience while the sink
// hangs, and the grants read after them would wait unconfirmed.
func (pl *places) take(ctx context.Context, patience time.Duration) bool {
	select {
	case pl.ch <- struct{}{}:
		return true
	default:
	}
	if pl.starved.Load() {
		return false
	}
	t := time.NewTimer(patience)
	defer t.Stop()
	select {
	case pl.ch <- struct{}{}:
		return true
	case <-t.C:
		pl.starved.Store(true)
	case <-ctx.Done():
	}
	return false
}

// give gives a place back.
func (pl *places) give() {
	<-pl.ch
	pl.starved.Store(false)
}

// deliverSlot takes the places a call to the sink needs (maxCalls): one
// of the shard's, and for a grant tried alone (its call of several ran
// out its DeliverTimeout: Worker.alone) one of the half of them such calls
// may hold, so that grants a sink hangs on never hold every place. It
// reports whether it took them; deliver gives them back.
func (w *Worker) deliverSlot(ctx context.Context, sh *shardLoop, alone bool) bool {
	if alone && !sh.lonely.take(ctx, w.cfg.Patience) {
		return false
	}
	if !sh.calls.take(ctx, w.cfg.Patience) {
		if alone {
			sh.lonely.give()
		}
		return false
	}
	return true
}

// deliver is one call to the sink of gs, bounded by DeliverTimeout, in the
// places deliverSlot took, which it gives back. timedOut says the call ran
// out its DeliverTimeout.
func (w *Worker) deliver(ctx context.Context, sh *shardLoop, gs []Grant, alone bool) (answers []error, timedOut bool) {
	defer func() {
		sh.calls.give()
		if alone {
			sh.lonely.give()
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, w.cfg.DeliverTimeout)
	defer cancel()
	answers = w.sink.Deliver(dctx, gs)
	return answers, ctx.Err() == nil && errors.Is(dctx.Err(), context.DeadlineExceeded)
}

// merge notes in p what q noted.
func (p *pass) merge(q *pass) {
	q.mu.Lock()
	oldest, incomplete, vanished, left := q.oldest, q.incomplete, q.vanished, q.left
	q.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if oldest != 0 && (p.oldest == 0 || oldest < p.oldest) {
		p.oldest = oldest
	}
	p.incomplete = p.incomplete || incomplete
	p.vanished = p.vanished || vanished
	for k := range left {
		if p.left == nil {
			p.left = map[string]bool{}
		}
		p.left[k] = true
	}
}
