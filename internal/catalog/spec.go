package catalog

// This file is what the catalogue makes of a spec: its form as stored, its
// window in a sub-pool's terms, and how its packets spread over sub-pools.

import (
	"encoding/json"

	"rain"
	"rain/internal/lua"
)

// canonical is the normalized spec as stored; two preloads are "the same"
// when their canonical forms are equal.
func canonical(s rain.Spec) string {
	b, _ := json.Marshal(s) // a struct of plain fields cannot fail
	return string(b)
}

// window is the spec's grab rules as a sub-pool keeps them, in ms.
func window(s rain.Spec) lua.Window {
	w := lua.Window{HoldMS: s.HoldSeconds * 1000}
	if s.StartsAt != nil {
		w.StartsMS = s.StartsAt.UnixMilli()
	}
	if s.EndsAt != nil {
		w.EndsMS = s.EndsAt.UnixMilli()
	}
	return w
}

// subPoolCounts splits count packets over k sub-pools: the first count%k get
// one more.
func subPoolCounts(count int64, k int) []int64 {
	out := make([]int64, k)
	for j := range out {
		out[j] = count / int64(k)
		if int64(j) < count%int64(k) {
			out[j]++
		}
	}
	return out
}

// packetsPerSubPool is how many packets rain puts in one sub-pool when it
// chooses K: a sub-pool is one Redis key set, and a hot key melts a flash
// sale; about 100k packets keep each one's load and audit time modest.
const packetsPerSubPool = 100_000

// autoSubPools is K when the operator leaves sub_pools at 0: one sub-pool per
// ~100k packets, at most one per shard, at least one. Spillover between
// sub-pools keeps a user from seeing sold out while a sibling has stock.
func autoSubPools(count int64, shards int) int {
	k := int((count + packetsPerSubPool - 1) / packetsPerSubPool)
	return max(1, min(k, shards))
}
