// Package rain is what a red-packet pool is, apart from how it is stored:
// the words every other package speaks. It imports no Redis client and
// does no I/O; internal/catalog stores and reads these values on the
// shards, internal/lua runs the scripts over a sub-pool's keys, and the
// grab path, settlement, the reaper and the HTTP API use them.
//
// The files: spec.go an operator's pool spec, its limits and the id rules;
// subpool.go a sub-pool's name, hash tag and keys (key names
// are data: they never change); error.go the error codes callers match, and
// what a client is told of an error.
package rain
