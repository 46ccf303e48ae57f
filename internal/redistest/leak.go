package redistest

import "go.uber.org/goleak"

// IgnoreProbe is the goleak option for go-redis's probe of a server whose
// connection pool failed as many dials as it holds connections: a
// goroutine that dials once a second until it succeeds or the pool is
// closed, so it outlives a test that killed a server by up to a second. It
// is go-redis's, not rain's.
func IgnoreProbe() goleak.Option {
	return goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")
}
