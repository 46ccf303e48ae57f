// Package rain is what a red-packet pool is, apart from how it is stored:
// the words every other package speaks. It imports no Redis client and
// does no I/O: internal/catalog stores these values on the shards and reads
// them back, internal/lua runs the scripts over a sub-pool's keys, and the
// grab path, settlement, the reaper and the HTTP API speak in them.
//
// The files:
//
//   - pool.go: a pool's record (spec, seed of its split, placement of its
//     sub-pools, state, account), the states of its life, a user's home
//     sub-pool.
//   - spec.go: an operator's pool spec, its limits, the id rules.
//   - subpool.go: a sub-pool's name, its hash tag and its keys (key names
//     are data: they never change).
//   - status.go, report.go, account.go: what operators read of a pool: its
//     status, its audit, the account of a closed pool.
//   - error.go: the error codes callers match, and what a client is told
//     of an error.
package rain
