// Package known answers on the spot whether a pool id may exist, so that
// grabs for unknown or forged pools are turned away without a trip to Redis.
//
// A Filter is a Bloom filter of the known pool ids. It has false positives
// (an unknown id that passes costs one trip to Redis, which then says the
// pool does not exist) but no false negatives: an id in the last Reset, or
// Added since the one before it, always passes. A Sync keeps a Filter
// current on every instance: it lists the shards' pool registries every
// second and learns a preloaded pool at once from a pub/sub notice.
package known

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/bits-and-blooms/bloom/v3"
)

const (
	// FalsePositiveRate is the most often a Filter lets an unknown id pass
	// while it holds as many ids as its capacity; right after a Reset it
	// holds half that, and the rate is far lower.
	FalsePositiveRate = 0.001

	// DefaultMinCapacity is Config.MinCapacity's default.
	DefaultMinCapacity = 10_000

	// designRate is what filters are sized for: half the promised rate.
	// bloom.EstimateParameters rounds k up, which for 0.001 lands the true
	// rate at capacity on 0.10003%, so a measurement would exceed the
	// promise about half the time. Sizing for 0.05% costs 1.4 bits per id.
	designRate = FalsePositiveRate / 2
)

// Config tunes a Filter. Zero fields take the documented defaults.
type Config struct {
	// MinCapacity is the fewest ids a filter is sized for, so that a small
	// registry still leaves room for the pools preloaded before the next
	// Reset. Default DefaultMinCapacity.
	MinCapacity int
}

// Filter is a Bloom filter of pool ids, safe for concurrent use.
//
// A Filter starts open: until its first Reset every id may exist, so an
// instance whose registry could not be read yet sends grabs to Redis (which
// knows) rather than answering 404 for pools that exist.
//
// Readers never lock: MayContain loads an immutable filter through an atomic
// pointer. Writers copy, change and swap it under mu: Add copies the filter
// (O(capacity) bits, once per preloaded pool), Reset and growth rebuild it.
// The zero Filter is not usable: use New. A Filter must not be copied after
// first use.
type Filter struct {
	minCap int

	bits atomic.Pointer[bloom.BloomFilter] // nil until the first Reset; never written to once stored

	mu       sync.Mutex          // serialises writers; guards the fields below
	reset    []string            // the ids given to the last Reset (the Filter owns them)
	carried  []string            // ids Added before the last Reset that it kept
	added    map[string]struct{} // ids Added since the last Reset
	capacity int                 // ids the current filter is sized for
}

// New returns an empty, open Filter.
func New(cfg Config) *Filter {
	if cfg.MinCapacity <= 0 {
		cfg.MinCapacity = DefaultMinCapacity
	}
	return &Filter{minCap: cfg.MinCapacity, added: make(map[string]struct{})}
}

// MayContain reports whether id may be a known pool. False means id was
// neither in the last Reset nor Added since the one before it. It is
// lock-free and does not allocate.
func (f *Filter) MayContain(id string) bool {
	b := f.bits.Load()
	return b == nil || b.TestString(id)
}

// Add records id. MayContain(id) is true once Add returns and stays true
// until a second Reset that does not list id.
func (f *Filter) Add(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.added[id]; ok {
		return // repeated notices (one per shard) cost a map lookup
	}
	f.added[id] = struct{}{}
	cur := f.bits.Load()
	switch {
	case cur == nil:
		// Still open; the first Reset carries id in.
	case f.lenLocked() > f.capacity:
		f.rebuildLocked()
	case cur.TestString(id):
		// Already passes; a rebuild includes id from f.added.
	default:
		// One memmove of the words; bloom's Copy ORs them in word by word.
		next := bloom.FromWithM(slices.Clone(cur.BitSet().Words()), cur.Cap(), cur.K())
		next.AddString(id)
		f.bits.Store(next)
	}
}

// Reset replaces the filter with one of ids plus the ids Added since the
// previous Reset, sized for max(2×that, MinCapacity), and swaps it in at
// once. Keeping the recent Adds means a pool preloaded while the registries
// were being listed is not lost by a listing that missed it; an id leaves the
// filter at the second Reset that does not list it.
//
// The Filter keeps ids (to rebuild from when Adds outgrow the capacity): the
// caller must not change it afterwards. Duplicates cost only room.
func (f *Filter) Reset(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	carried := make([]string, 0, len(f.added))
	for id := range f.added {
		carried = append(carried, id)
	}
	f.reset, f.carried = ids, carried
	clear(f.added)
	f.rebuildLocked()
}

// lenLocked counts the ids the filter must hold, duplicates included.
func (f *Filter) lenLocked() int {
	return len(f.reset) + len(f.carried) + len(f.added)
}

// rebuildLocked builds a filter of every id it must hold, with room for as
// many again, and swaps it in.
func (f *Filter) rebuildLocked() {
	f.capacity = max(2*f.lenLocked(), f.minCap)
	b := bloom.NewWithEstimates(uint(f.capacity), designRate)
	for _, id := range f.reset {
		b.AddString(id)
	}
	for _, id := range f.carried {
		b.AddString(id)
	}
	for id := range f.added {
		b.AddString(id)
	}
	f.bits.Store(b)
}
