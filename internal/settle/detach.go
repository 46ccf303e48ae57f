package settle

// This file is a pass that goes on without a batch that takes too long
// (Config.Patience): a sink that hangs for some grants (a lock in the
// database, a wallet that never answers one account) must not hold up the
// confirms of every other grant of the shard, which would then run out
// their hold and be released unpaid though their users were told granted.

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// maxDetached bounds a shard's batches still running after a pass went on
// without them. Past it, passes confirm their grants and put their
// deliveries off (settleGrants), so a sink that hangs for everyone costs
// at most this many calls in flight per shard.
const maxDetached = 8

// settleOrGoOn settles msgs (settleBatch), waiting at most Config.Patience
// for it. A batch that takes longer runs on by itself: its entries are
// noted unsettled in p and skipped by later passes until it ends (Worker.
// running), and what it reports then is its own (its failed deliveries
// wait their retries, its acknowledgment is made when it ends). While the
// shard has maxDetached batches running so, the batch is settled in the
// pass: it delivers nothing, so it cannot hang.
func (w *Worker) settleOrGoOn(ctx context.Context, sh *shardLoop, stream string, msgs []redis.XMessage, p *pass) (failed bool) {
	if sh.slow.Load() >= maxDetached {
		return w.settleBatch(ctx, sh, stream, msgs, p)
	}
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
			for _, m := range msgs {
				w.running.Delete(stream + " " + m.ID)
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
		w.running.Store(stream+" "+m.ID, true)
		p.behind(m.ID)
	}
	w.cfg.Logger.Warn("settle: a batch takes longer than the patience; the pass goes on without it",
		"shard", sh.name, "stream", stream, "entries", len(msgs), "patience", w.cfg.Patience, "running", sh.slow.Load())
	return false
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
