// Package soldout remembers, briefly, which sub-pools answered empty, so that
// once a pool has sold out the flood of grabs after it is answered sold_out
// without a trip to Redis.
//
// A mark is trusted for TTL, at most a second (the product rule that makes a
// cached answer honest under invariant 4: sold_out means the whole pool had
// no stock "just now"), or until stock comes back to the sub-pool: the
// release and untake scripts publish a stock notice on rain:events, and the
// grab service, which hears it (internal/events), calls Forget. A notice lost
// on the way is covered by the TTL.
//
// One mark can outlive a Forget by up to TTL: a grab that read "empty" just
// before the stock came back may mark after the notice arrived. The TTL bounds
// that too.
package soldout

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// DefaultTTL is Config.TTL's default.
	DefaultTTL = time.Second
	// MaxTTL is the longest a mark is trusted; longer TTLs are cut to it.
	MaxTTL = time.Second
	// DefaultMaxPools is Config.MaxPools's default.
	DefaultMaxPools = 100_000
	// MaxSubPools bounds sub-pool indexes: MarkEmpty ignores j ≥ MaxSubPools
	// (and j < 0), so a wrong index cannot make an entry huge.
	MaxSubPools = 1024

	numShards = 32 // a power of two; writers of one shard never slow readers of any
	minSubs   = 4  // sub-pool slots an entry starts with
)

// Config tunes a Cache. Zero fields take the documented defaults.
type Config struct {
	// TTL is how long an empty answer is trusted. Default DefaultTTL; values
	// above MaxTTL are cut to MaxTTL.
	TTL time.Duration
	// MaxPools bounds how many pools are remembered (rounded up to a
	// multiple of 32). Expired pools are dropped first; then the pools whose
	// marks expire soonest. Default DefaultMaxPools.
	MaxPools int
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Cache remembers empty sub-pools. It is safe for concurrent use; Empty,
// AllEmpty and MarkEmpty of a pool already held take no lock and do not
// allocate. The zero Cache is not usable: use New.
//
// The pools of a shard live in a map that is never written to: a writer that
// adds a pool copies it, dropping expired pools on the way (that is the
// sweep), and swaps the copy in. Marks are atomics inside the entries, so
// marking a pool already present changes no map.
type Cache struct {
	ttl      int64 // nanoseconds
	now      func() time.Time
	epoch    time.Time // deadlines count nanoseconds from here (monotonic under time.Now)
	perShard int       // most pools one shard holds
	seed     maphash.Seed
	shards   [numShards]shard
}

type shard struct {
	pools atomic.Pointer[map[string]*entry] // read without a lock; replaced whole under mu
	mu    sync.Mutex                        // serialises writers of pools, and Forget with the copy of a growing entry
	_     [48]byte                          // keeps shards on separate cache lines
}

// entry holds one pool's marks. Its length is fixed; marking a higher
// sub-pool replaces the entry with a longer copy.
type entry struct {
	until []atomic.Int64 // per sub-pool: deadline in ns since epoch while known empty; 0: not known
}

// New returns an empty Cache.
func New(cfg Config) *Cache {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	cfg.TTL = min(cfg.TTL, MaxTTL)
	if cfg.MaxPools <= 0 {
		cfg.MaxPools = DefaultMaxPools
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &Cache{
		ttl:      int64(cfg.TTL),
		now:      cfg.Now,
		epoch:    cfg.Now(),
		perShard: (cfg.MaxPools + numShards - 1) / numShards,
		seed:     maphash.MakeSeed(),
	}
	for i := range c.shards {
		empty := map[string]*entry{}
		c.shards[i].pools.Store(&empty)
	}
	return c
}

// MarkEmpty remembers that sub-pool j of pool answered empty just now.
func (c *Cache) MarkEmpty(pool string, j int) {
	if j < 0 || j >= MaxSubPools {
		return
	}
	until := c.tick() + c.ttl
	s := c.shard(pool)
	if e := (*s.pools.Load())[pool]; e != nil && j < len(e.until) {
		// A store racing a writer that replaces e may be lost: that costs
		// one more trip to Redis, never a wrong answer.
		e.until[j].Store(until)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c.insertLocked(s, pool, j, until)
}

// Empty reports whether sub-pool j of pool is known empty right now.
func (c *Cache) Empty(pool string, j int) bool {
	e := (*c.shard(pool).pools.Load())[pool]
	if e == nil || j < 0 || j >= len(e.until) {
		return false
	}
	u := e.until[j].Load()
	return u != 0 && c.tick() < u
}

// AllEmpty reports whether every one of the pool's k sub-pools (0..k-1) is
// known empty right now: then the pool is sold out.
func (c *Cache) AllEmpty(pool string, k int) bool {
	e := (*c.shard(pool).pools.Load())[pool]
	if e == nil || k <= 0 || k > len(e.until) {
		return false
	}
	now := c.tick()
	for i := range k {
		if u := e.until[i].Load(); u == 0 || now >= u {
			return false
		}
	}
	return true
}

// Forget drops the mark of sub-pool j of pool: stock came back to it.
func (c *Cache) Forget(pool string, j int) {
	s := c.shard(pool)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := (*s.pools.Load())[pool]; e != nil && j >= 0 && j < len(e.until) {
		e.until[j].Store(0)
	}
}

func (c *Cache) shard(pool string) *shard {
	return &c.shards[maphash.String(c.seed, pool)&(numShards-1)]
}

// tick is the clock in ns since epoch.
func (c *Cache) tick() int64 {
	return int64(c.now().Sub(c.epoch))
}

// insertLocked marks sub-pool j of pool in s, adding the pool or growing its
// entry. It copies the shard's map, dropping expired pools, and evicts the
// pool that expires soonest when the shard is still full.
func (c *Cache) insertLocked(s *shard, pool string, j int, until int64) {
	old := *s.pools.Load()
	e := old[pool]
	if e != nil && j < len(e.until) { // another writer got here first
		e.until[j].Store(until)
		return
	}
	n := max(j+1, minSubs)
	if e != nil {
		n = min(max(n, 2*len(e.until)), MaxSubPools)
	}
	grown := &entry{until: make([]atomic.Int64, n)}
	if e != nil {
		for i := range e.until {
			grown.until[i].Store(e.until[i].Load())
		}
	}
	grown.until[j].Store(until)

	now := c.tick()
	next := make(map[string]*entry, len(old)+1)
	for id, x := range old {
		if id != pool && x.expiry() > now {
			next[id] = x
		}
	}
	if len(next) >= c.perShard {
		var soonest string
		at := int64(math.MaxInt64)
		for id, x := range next {
			if exp := x.expiry(); exp < at {
				soonest, at = id, exp
			}
		}
		delete(next, soonest)
	}
	next[pool] = grown
	s.pools.Store(&next)
}

// expiry is when e's last mark expires.
func (e *entry) expiry() int64 {
	var last int64
	for i := range e.until {
		last = max(last, e.until[i].Load())
	}
	return last
}
