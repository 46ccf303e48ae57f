// Package limit is rain's rate limiting: a token bucket per key (a user
// id, a client IP) in bounded memory.
//
// A bucket is 16 bytes beside its key. Memory is bounded by MaxKeys: when a
// shard of the table is full, buckets that have refilled (whose key would
// get a full bucket anyway) are dropped first; if that frees too little, an
// eighth of the shard is dropped at random, which lets those keys start
// again with a full burst: the price of a flood of distinct keys is some
// leniency, never unbounded memory. A flood of distinct ids from one IP is
// what the per-IP limit is for.
package limit

import (
	"hash/maphash"
	"math"
	"sync"
	"time"
)

// Limiter is a set of token buckets. The zero value is not usable; New
// makes one. Safe for concurrent use.
type Limiter struct {
	rate   float64   // tokens a second
	burst  float64   // bucket size
	perCap int       // keys per shard
	epoch  time.Time // New's time, with its monotonic clock reading
	seed   maphash.Seed
	shards [nShards]shard
}

const nShards = 64

type shard struct {
	mu sync.Mutex
	m  map[string]bucket
	_  [40]byte // keep shards on separate cache lines
}

type bucket struct {
	tokens float64
	at     int64 // ns after the limiter's epoch of the last update
}

// Config configures a Limiter.
type Config struct {
	Rate    float64 // tokens a second (> 0)
	Burst   int     // bucket size (>= 1)
	MaxKeys int     // keys kept at most (default 100,000)
}

// DefaultMaxKeys bounds the keys a limiter keeps unless told otherwise.
const DefaultMaxKeys = 100_000

// New returns a limiter.
func New(cfg Config) *Limiter {
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	l := &Limiter{rate: cfg.Rate, burst: float64(max(1, cfg.Burst)), perCap: max(1, cfg.MaxKeys/nShards), epoch: time.Now(), seed: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].m = make(map[string]bucket)
	}
	return l
}

// Allow takes a token from key's bucket at now. When there is none it
// reports false and how long until there is one. Give now as time.Now()
// returns it: buckets refill by the monotonic clock then (now.Sub of the
// limiter's epoch), so a step of the wall clock (NTP, an operator) neither
// stalls every bucket until the wall clock catches up nor fills them all.
func (l *Limiter) Allow(key string, now time.Time) (ok bool, retryAfter time.Duration) {
	sh := &l.shards[maphash.String(l.seed, key)%nShards]
	t := int64(now.Sub(l.epoch))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b, found := sh.m[key]
	if !found {
		if len(sh.m) >= l.perCap {
			l.evict(sh, t)
		}
		b = bucket{tokens: l.burst, at: t}
	} else if t > b.at {
		b.tokens = math.Min(l.burst, b.tokens+float64(t-b.at)/1e9*l.rate)
		b.at = t
	}
	if b.tokens >= 1 {
		b.tokens--
		sh.m[key] = b
		return true, 0
	}
	sh.m[key] = b
	return false, time.Duration((1 - b.tokens) / l.rate * 1e9)
}

// Peek reports whether key's bucket holds a token at now, as Allow would,
// without taking it (and how long until it does, when it does not). A key
// it has no bucket for has a full one.
func (l *Limiter) Peek(key string, now time.Time) (ok bool, retryAfter time.Duration) {
	sh := &l.shards[maphash.String(l.seed, key)%nShards]
	t := int64(now.Sub(l.epoch))
	sh.mu.Lock()
	b, found := sh.m[key]
	sh.mu.Unlock()
	if !found {
		return true, 0
	}
	tokens := b.tokens
	if t > b.at {
		tokens = math.Min(l.burst, tokens+float64(t-b.at)/1e9*l.rate)
	}
	if tokens >= 1 {
		return true, 0
	}
	return false, time.Duration((1 - tokens) / l.rate * 1e9)
}

// evict makes room in a full shard: buckets that have refilled go first (a
// new bucket would be the same), then an eighth of the shard at random.
func (l *Limiter) evict(sh *shard, t int64) {
	for k, b := range sh.m {
		if b.tokens+float64(t-b.at)/1e9*l.rate >= l.burst {
			delete(sh.m, k)
		}
	}
	if len(sh.m) < l.perCap*7/8 {
		return
	}
	drop := max(1, len(sh.m)/8)
	for k := range sh.m { // map order is random
		if drop == 0 {
			break
		}
		delete(sh.m, k)
		drop--
	}
}

// Len is the keys held, for metrics and tests.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
