package catalog

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"

	"rain"
)

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

// Pool is a pool's record as stored under rain:{P}:pool: its spec, the seed
// of its split, the shard of each sub-pool, its state. A Pool is a value
// read from the shards: it never changes once read.
type Pool struct {
	Spec      rain.Spec
	Seed      uint64
	Placement []string // shard name of sub-pool j
	Salts     []string // salt of sub-pool j's hash tag ("" but on a cluster shard: see rain.SubPool)
	State     State
	Account   *rain.Account // the final account, once closing or closed

	specJSON string // Spec as stored: two preloads are the same when these are equal
}

// same reports whether p and o are copies of one pool's record: the same
// spec, seed and placement (their states and accounts may differ).
func (p *Pool) same(o *Pool) bool {
	return p.specJSON == o.specJSON && p.Seed == o.Seed && slices.Equal(p.Placement, o.Placement) && slices.Equal(p.Salts, o.Salts)
}

// ID is the pool's id.
func (p *Pool) ID() string { return p.Spec.PoolID }

// SubPools is the number of sub-pools.
func (p *Pool) SubPools() int { return len(p.Placement) }

// SubPool names sub-pool j.
func (p *Pool) SubPool(j int) rain.SubPool {
	return rain.SubPool{Pool: p.Spec.PoolID, Index: j, Salt: p.Salts[j]}
}

// Home is the sub-pool that holds userID's grant: dedup lives there, so a
// user's grab is one script on one shard unless the home is empty.
func (p *Pool) Home(userID string) int { return Home(userID, len(p.Placement)) }

// Home is the home sub-pool of userID in a pool of k sub-pools.
func Home(userID string, k int) int {
	return int(xxhash.Sum64String(userID) % uint64(k))
}

// recordKey is the key of a pool's record; its hash tag is the pool's own.
func recordKey(pool string) string { return "rain:{" + pool + "}:pool" }

// registryKey lists every pool id on a shard.
const registryKey = "rain:pools"

// fields is the record as stored.
func (p *Pool) fields() map[string]string {
	f := map[string]string{
		"spec": p.specJSON, "seed": strconv.FormatUint(p.Seed, 10),
		"placement": strings.Join(p.Placement, ","), "state": string(p.State),
	}
	if p.Account != nil {
		b, _ := json.Marshal(p.Account) // plain fields cannot fail
		f["account"] = string(b)
	}
	if slices.ContainsFunc(p.Salts, func(s string) bool { return s != "" }) {
		f["tags"] = strings.Join(p.Salts, ",")
	}
	return f
}

// parseRecord reads a record as stored.
func parseRecord(m map[string]string) (*Pool, error) {
	p := &Pool{specJSON: m["spec"], State: State(m["state"])}
	if err := json.Unmarshal([]byte(p.specJSON), &p.Spec); err != nil {
		return nil, fmt.Errorf("pool record: spec: %w", err)
	}
	seed, err := strconv.ParseUint(m["seed"], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("pool record: seed: %w", err)
	}
	p.Seed = seed
	if m["placement"] == "" {
		return nil, errors.New("pool record: no placement")
	}
	p.Placement = strings.Split(m["placement"], ",")
	p.Salts = make([]string, len(p.Placement))
	if t := m["tags"]; t != "" {
		if p.Salts = strings.Split(t, ","); len(p.Salts) != len(p.Placement) {
			return nil, fmt.Errorf("pool record: %d tags for %d sub-pools", len(p.Salts), len(p.Placement))
		}
	}
	if a := m["account"]; a != "" {
		p.Account = &rain.Account{}
		if err := json.Unmarshal([]byte(a), p.Account); err != nil {
			return nil, fmt.Errorf("pool record: account: %w", err)
		}
	}
	if p.State.Over() && p.Account == nil {
		return nil, fmt.Errorf("pool record: %s without its account", p.State)
	}
	return p, nil
}
