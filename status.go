package rain

// This file is a pool's status as operators read it: its counters, summed
// over its sub-pools and sub-pool by sub-pool.

// Status is a pool's state for operators (GET /admin/pools/{id}).
type Status struct {
	PoolID         string          `json:"pool_id"`
	State          string          `json:"state"`
	TotalCents     int64           `json:"total_cents"`
	Count          int64           `json:"count"`
	RemainingCount int64           `json:"remaining_count"`
	RemainingCents int64           `json:"remaining_cents"`
	HeldCount      int64           `json:"held_count"`
	HeldCents      int64           `json:"held_cents"`
	ConfirmedCount int64           `json:"confirmed_count"`
	ConfirmedCents int64           `json:"confirmed_cents"`
	ReleasedCount  int64           `json:"released_count"`
	ReleasedCents  int64           `json:"released_cents"`
	SubPools       []SubPoolStatus `json:"sub_pools"`
	Spec           Spec            `json:"spec"`
	// Account is the final account of a closed (or closing) pool: then it
	// is the pool's status, and the fields above are not read.
	Account *Account `json:"-"`
}

// SubPoolStatus is one sub-pool's share of a Status.
type SubPoolStatus struct {
	Index          int    `json:"index"`
	Shard          string `json:"shard"`
	State          string `json:"state"`
	Count          int64  `json:"count"`       // packets loaded into it
	TotalCents     int64  `json:"total_cents"` // cents loaded into it
	RemainingCount int64  `json:"remaining_count"`
	RemainingCents int64  `json:"remaining_cents"`
}
