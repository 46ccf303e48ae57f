package grab

// This file marks, in each shard's due index (lua.MarkDue), the sub-pools
// this instance granted or spilled from, so that the reaper sweeps the
// sub-pools with work rather than every sub-pool of every pool: a season
// preloaded ahead of its rains costs nothing while it waits.
//
// A grant falls due no sooner than what the index holds, so its mark keeps
// a sub-pool's time. A spill's transfer may need the reaper within the
// spill's age, long before the grants held there fall due: its mark
// (markSooner) brings the sub-pool's time forward, and is made for every
// transfer (spills are rare), so none waits for the grants' deadline.
//
// Marks leave in the background, gathered per shard (one script call for
// every sub-pool marked meanwhile), so no grab waits for one. A sub-pool is
// marked at most once per markEvery by this instance; a grant it made in
// between, unmarked, cannot be left out of the index: a sub-pool marked
// within lua.DueQuiet (far more than markEvery) of a look that found
// nothing there is looked at again, not dropped, and one marked after the
// look's read stays due (see due_done.lua). A first mark asks for the
// first look 2×markEvery later, so a rain of grants is not swept as it
// comes. A mark lost to a crash is made up by the reaper's slow pass over
// every live pool.

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"rain/internal/lua"
	"rain/internal/shard"
)

// markEvery is how often this instance marks one sub-pool at most. Holds
// are whole seconds, so it is far below any hold.
const markEvery = 250 * time.Millisecond

// marker gathers and sends the marks.
type marker struct {
	shards *shard.Set
	log    *slog.Logger
	kick   chan struct{}
	failed atomic.Int64 // mark calls that failed, ever

	mu      sync.Mutex
	last    map[string]time.Time // by meta key: when this instance last marked it
	pending map[string][]string  // by shard name: meta keys to mark
	sooner  map[string][]string  // by shard name: meta keys to mark sooner (markSooner)
	pruned  time.Time            // when last was last cleared of old marks
}

func newMarker(shards *shard.Set, log *slog.Logger) *marker {
	return &marker{shards: shards, log: log, kick: make(chan struct{}, 1),
		last: map[string]time.Time{}, pending: map[string][]string{}, sooner: map[string][]string{}}
}

// markSooner marks the sub-pool whose meta key is meta, on the named shard,
// as having a spill's transfer in flight: due for a look soon, even when it
// was due later.
func (m *marker) markSooner(shardName, meta string) {
	m.mu.Lock()
	m.sooner[shardName] = append(m.sooner[shardName], meta)
	m.mu.Unlock()
	m.wake()
}

// wake has run flush.
func (m *marker) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// mark marks the sub-pool whose meta key is meta, on the named shard,
// unless this instance did within markEvery.
func (m *marker) mark(shardName, meta string) {
	now := time.Now()
	m.mu.Lock()
	if t, ok := m.last[meta]; ok && now.Sub(t) < markEvery {
		m.mu.Unlock()
		return
	}
	m.last[meta] = now
	m.pending[shardName] = append(m.pending[shardName], meta)
	m.mu.Unlock()
	m.wake()
}

// run sends the marks as they come until stop is closed, then sends what
// is left (for up to the call budget).
func (m *marker) run(stop <-chan struct{}) {
	for {
		select {
		case <-m.kick:
			ctx, cancel := context.WithTimeout(context.Background(), m.shards.Timeout())
			m.flush(ctx)
			cancel()
		case <-stop:
			ctx, cancel := context.WithTimeout(context.Background(), m.shards.Timeout())
			m.flush(ctx)
			cancel()
			return
		}
	}
}

// flush sends every shard's pending marks, one call per shard and kind. A
// shard that fails keeps its marks for a flush a second later.
func (m *marker) flush(ctx context.Context) {
	m.mu.Lock()
	pending, sooner := m.pending, m.sooner
	m.pending, m.sooner = map[string][]string{}, map[string][]string{}
	now := time.Now()
	if now.Sub(m.pruned) > time.Minute {
		for k, t := range m.last {
			if now.Sub(t) >= markEvery {
				delete(m.last, k)
			}
		}
		m.pruned = now
	}
	m.mu.Unlock()
	m.send(ctx, pending, lua.MarkDue, func() map[string][]string { return m.pending })
	m.send(ctx, sooner, lua.MarkDueSooner, func() map[string][]string { return m.sooner })
}

// send sends marks of one kind, by shard; a shard's that fail go back into
// the map again returns (under m.mu), and are sent a second later.
func (m *marker) send(ctx context.Context, marks map[string][]string,
	mark func(context.Context, lua.Client, time.Duration, []string) error, again func() map[string][]string) {
	for name, metas := range marks {
		c := m.shards.Client(name)
		if c == nil {
			continue
		}
		slices.Sort(metas)
		metas = slices.Compact(metas) // a sub-pool spilled from many times since the last flush is marked once
		if err := mark(ctx, c, 2*markEvery, metas); err != nil {
			m.failed.Add(1)
			m.log.Debug("due marks not sent; sent again in a second", "shard", name, "sub_pools", len(metas), "err", err)
			m.mu.Lock()
			back := again()
			back[name] = append(back[name], metas...)
			m.mu.Unlock()
			time.AfterFunc(time.Second, m.wake)
		}
	}
}
