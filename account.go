package rain

// This file is a closed pool's account: what was preloaded, confirmed and
// left unclaimed, in count and in cents, pool and sub-pool.

import "time"

// Account is a closed pool's final account, in count and in cents: what was
// preloaded, what was confirmed (paid to users), what was left unclaimed
// (back to the campaign), per sub-pool too. Preloaded = confirmed +
// unclaimed.
type Account struct {
	PoolID         string           `json:"pool_id"`
	State          string           `json:"state"` // "closed" ("closing" while its keys are freed)
	PreloadedCount int64            `json:"preloaded_count"`
	PreloadedCents int64            `json:"preloaded_cents"`
	ConfirmedCount int64            `json:"confirmed_count"`
	ConfirmedCents int64            `json:"confirmed_cents"`
	UnclaimedCount int64            `json:"unclaimed_count"`
	UnclaimedCents int64            `json:"unclaimed_cents"`
	ClosedAt       time.Time        `json:"closed_at"`
	SubPools       []SubPoolAccount `json:"sub_pools"`
}

// SubPoolAccount is one sub-pool's share of an Account. A sub-pool that
// lent stock to its siblings (spills) confirms less than it was loaded
// with, one that borrowed more; the pool's sums balance.
type SubPoolAccount struct {
	Index          int   `json:"index"`
	ConfirmedCount int64 `json:"confirmed_count"`
	ConfirmedCents int64 `json:"confirmed_cents"`
	UnclaimedCount int64 `json:"unclaimed_count"`
	UnclaimedCents int64 `json:"unclaimed_cents"`
}

// Tally is a count of grants and their cents.
type Tally struct{ Count, Cents int64 }
