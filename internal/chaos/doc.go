// Package chaos holds rain's fault tests that span packages: several rain
// instances, the reaper and settlement, on real redis-server shards behind
// loss-injecting proxies (internal/redisproxy), checked afterwards against
// rain's invariants: no over-issue, conservation (the audit), one grant per
// user, every grant answered 200 still there; and the life of pools over a
// season, settled into a real PostgreSQL (internal/pgtest), closed, their
// Redis memory given back. It has no code of its own.
package chaos
