package rain

// This file is what a pool is: its record (spec, seed of its split,
// placement of its sub-pools, state, account), where it is in its life,
// and which of its sub-pools is a user's home.

import "github.com/cespare/xxhash/v2"

// State is where a pool is in its life, as its record says.
type State string

// Pool states.
const (
	// Loading: the record is written, the stock is being loaded; grabs
	// answer not_started.
	Loading State = "loading"
	// Open: every sub-pool holds all its stock; grabs are decided by the
	// sub-pools (their window: not started, open, ended).
	Open State = "open"
	// Closing: a close has sealed every sub-pool and recorded the account;
	// it is freeing the pool's keys. Grabs answer ended.
	Closing State = "closing"
	// Closed: the pool's keys are freed; its record holds the account.
	// Grabs answer ended.
	Closed State = "closed"
)

// Over reports whether the pool's life is over: closing or closed.
func (s State) Over() bool { return s == Closing || s == Closed }

// Before reports whether s comes earlier in a pool's life than o: loading,
// open, closing, closed (an unknown state comes before them all).
func (s State) Before(o State) bool { return s.stage() < o.stage() }

// stage orders the states along a pool's life (an unknown state first).
func (s State) stage() int {
	switch s {
	case Loading:
		return 1
	case Open:
		return 2
	case Closing:
		return 3
	case Closed:
		return 4
	}
	return 0
}

// Pool is a pool's record: its spec, the seed of its split, the shard of
// each sub-pool, its state. A Pool is a value read from the shards
// (internal/catalog stores it under rain:{P}:pool): it never changes once
// read.
type Pool struct {
	Spec      Spec
	Seed      uint64
	Placement []string // shard name of sub-pool j
	Salts     []string // salt of sub-pool j's hash tag ("" but on a cluster shard: see SubPool)
	State     State
	Account   *Account // the final account, once closing or closed
}

// ID is the pool's id.
func (p *Pool) ID() string { return p.Spec.PoolID }

// SubPools is the number of sub-pools.
func (p *Pool) SubPools() int { return len(p.Placement) }

// SubPool names sub-pool j.
func (p *Pool) SubPool(j int) SubPool {
	return SubPool{Pool: p.Spec.PoolID, Index: j, Salt: p.Salts[j]}
}

// Home is the sub-pool that holds userID's grant: dedup lives there, so a
// user's grab is one script on one shard unless the home is empty.
func (p *Pool) Home(userID string) int { return Home(userID, len(p.Placement)) }

// Home is the home sub-pool of userID in a pool of k sub-pools.
func Home(userID string, k int) int {
	return int(xxhash.Sum64String(userID) % uint64(k))
}
