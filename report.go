package rain

// This file is an audit's report: the differences the conservation check
// found, each pinned to its sub-pool, shard and spill.

import "fmt"

// Report is the conservation check of one pool (GET /admin/pools/{id}/audit).
type Report struct {
	PoolID   string    `json:"pool_id"`
	OK       bool      `json:"ok"`
	Problems []Problem `json:"problems"`
	// Notes say what the audit could not check, and why (a sub-pool that
	// kept changing during its recount): not problems.
	Notes []string `json:"notes,omitempty"`
}

// Problem is one difference the audit found. SubPool is nil for a problem of
// the whole pool; Token names the spill a problem of a transfer is about.
type Problem struct {
	SubPool  *int   `json:"sub_pool,omitempty"`
	Shard    string `json:"shard,omitempty"`
	Token    string `json:"token,omitempty"`
	Quantity string `json:"quantity"`
	Expected int64  `json:"expected"`
	Found    int64  `json:"found"`
}

func (p Problem) String() string {
	where := "pool"
	if p.SubPool != nil {
		where = fmt.Sprintf("sub-pool %d on %s", *p.SubPool, p.Shard)
	}
	if p.Token != "" {
		where += " spill token " + p.Token
	}
	return fmt.Sprintf("%s: %s expected %d, found %d", where, p.Quantity, p.Expected, p.Found)
}
