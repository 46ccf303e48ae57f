// Package chaos holds rain's fault tests that span packages: several rain
// instances, the reaper and settlement, on real redis-server shards behind
// loss-injecting proxies (internal/redisproxy), checked against the
// invariants of DESIGN.md afterwards. It has no code of its own.
package chaos
