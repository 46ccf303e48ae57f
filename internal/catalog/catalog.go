// Package catalog is how rain stores its pools, and the one place that
// reads and writes what it stores; what a pool is (rain.Pool, rain.Spec,
// rain.State, rain.Account, ...) lives in the domain package rain. Here: a
// pool's record as stored (record.go) and the canonical form of its spec,
// the registry of pools and the lookups (registry.go, turn.go), preload,
// status, audit, end and close, the list of sub-pools that settlement works
// through, and the confirm of a grant. A lookup's name says whether it
// reads Redis: Read, ReadList and ReadListInTurn do; Cached and CachedList
// answer from memory and read Redis on a miss or when stale; LastList never.
//
// A pool's record is stored under rain:{P}:pool on every shard, and its id in
// the registry rain:pools of every shard, so a later change of the ring
// never strands it: the placement is read back, never recomputed. The serial
// shard (the set's, shard.Options.Serial) arbitrates: a preload writes the record there
// first, atomically, and what is stored there wins. Sub-pool j lives on the
// shard its placement names, under keys tagged {P:j} (rain.SubPool.Keys).
//
// Its consumers each name what they use of it, in an interface of their
// own: the grab path grab.Pools, the reaper reaper.Pools, settlement
// settle.SubPools, the HTTP API api.Pools; the tools use the catalog
// alone, and start no claim lanes.
package catalog

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"rain"
	"rain/internal/shard"
)

// Config wires a Catalog. Zero fields take the documented defaults.
type Config struct {
	// Books, when set, is the system of record a close reconciles with
	// (the grants it holds, per sub-pool) and writes the final account to.
	// Nil: closes check the shards alone.
	Books Books
	// SealLease is how long a close's seal on a sub-pool is its own: another
	// close meets "another close is at work" until it runs out, and takes
	// the seal over after (the first close died). It must exceed the time
	// a close takes from its first seal to its account recorded (an audit
	// and the books' totals). Default 1 minute.
	SealLease time.Duration
	// Logger for repairs of the serial shard's copies. Default: discard.
	Logger *slog.Logger
}

// Catalog reads and writes the pools' records on a set of shards. It is
// safe for concurrent use and owns no goroutine.
type Catalog struct {
	shards *shard.Set
	serial string        // the shards' serial shard: its records decide
	books  Books         // Config.Books
	lease  time.Duration // Config.SealLease
	log    *slog.Logger

	mu      sync.RWMutex          // guards records, closed, lives and onOpen
	records map[string]*rain.Pool // records of open and closed pools, read once: see Cached
	closed  int                   // the closed ones among them, at most closedKept
	// closedIDs are the ids of every pool seen closed, records kept or not:
	// a close is for good, so CachedList leaves them out.
	closedIDs map[string]bool
	kept      int                   // closedKept; tests set fewer
	lives     map[string]string     // each shard's life counter as the last registry read saw it
	regs      map[string][]string   // each shard's registry as last read (ReadList, ReadListInTurn)
	turn      int                   // the shard ReadListInTurn reads next
	onOpen    []func(poolID string) // see OnOpen

	listed atomic.Pointer[listing] // the registry as ReadList or ReadListInTurn last read it
}

// listing is a registry read and when it was made.
type listing struct {
	ids []string
	at  time.Time
}

func (c *Config) init() {
	if c.SealLease <= 0 {
		c.SealLease = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// New returns a catalog over shards. The shards' serial shard
// (shard.Options.Serial) arbitrates: a preload writes a pool's record there
// first, and what is stored there wins.
func New(shards *shard.Set, cfg Config) *Catalog {
	cfg.init()
	return &Catalog{shards: shards, serial: shards.Serial(), books: cfg.Books, lease: cfg.SealLease, log: cfg.Logger,
		records: map[string]*rain.Pool{}, kept: closedKept, closedIDs: map[string]bool{}, lives: map[string]string{}, regs: map[string][]string{}}
}

// listedEvery is how long a registry read serves CachedList.
const listedEvery = 2 * time.Second

// CachedList is the pools as the registry was last read (ReadList,
// ReadListInTurn), with the open pools met since (a pool preloaded a moment
// ago may not be in the read yet). No I/O while the last read is younger
// than 2 s; it reads Redis (ReadList) when it is older, or there was none.
// What background work that visits every pool (settlement's listing, the
// reaper) goes through, so the pools seen closed are left out: a close is
// for good, their keys are freed, and a season past closedKept closed
// pools would have each of their records read again on every visit.
func (c *Catalog) CachedList(ctx context.Context) ([]string, error) {
	l := c.listed.Load()
	if l == nil || time.Since(l.at) > listedEvery {
		ids, err := c.ReadList(ctx)
		if err != nil && !errors.Is(err, rain.ErrPartial) {
			return nil, err
		}
		if l = c.listed.Load(); l == nil {
			l = &listing{ids: ids} // a partial read, the first
		}
	}
	c.mu.RLock()
	ids := slices.DeleteFunc(slices.Clone(l.ids), func(id string) bool { return c.closedIDs[id] })
	for id := range c.records {
		if !c.closedIDs[id] && !slices.Contains(l.ids, id) {
			ids = append(ids, id)
		}
	}
	c.mu.RUnlock()
	return ids, nil
}

// LastList is the registry as ReadList or ReadListInTurn last read it. No
// I/O; nil when it was never read whole.
func (c *Catalog) LastList() []string {
	if l := c.listed.Load(); l != nil {
		return l.ids
	}
	return nil
}
