package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Set is the named Redis shards behind a Ring: one go-redis client per shard.
// It is safe for concurrent use; Close it once when done.
type Set struct {
	ring    *Ring
	names   []string // sorted
	clients map[string]*redis.Client
}

// Options tune every shard's client. The zero value is what rain serve
// runs with; tests use the same, so they see go-redis's retries (3 per
// command or pipeline, after a lost reply too) as production does. Every
// script rain runs answers a re-send as it answered the first run, which is
// what makes those retries safe.
type Options struct {
	// PoolSize is connections per shard; 0 keeps go-redis's default (10 per CPU).
	PoolSize int
}

// NewClient returns a client of the shard at addr with rain's client
// options. Open uses it for every shard.
func NewClient(addr string, opts Options) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr,
		// RESP2: rain uses no push notifications, and with RESP3 go-redis
		// peeks the socket for them before every command (a syscall).
		Protocol: 2,
		// Socket reads and writes honour ctx deadlines, so a hung shard
		// cannot hold a grab, or the reaper lock's extension, past them.
		ContextTimeoutEnabled: true,
		PoolSize:              opts.PoolSize,
	})
}

// Open builds the ring over specs and a client per shard. It does no I/O:
// clients connect on first use.
func Open(specs []Spec, vnodes int, opts Options) (*Set, error) {
	ring, err := NewRing(specs, vnodes)
	if err != nil {
		return nil, err
	}
	s := &Set{ring: ring, clients: make(map[string]*redis.Client, len(specs))}
	for _, sp := range specs {
		s.names = append(s.names, sp.Name)
		s.clients[sp.Name] = NewClient(sp.Addr, opts)
	}
	slices.Sort(s.names)
	return s, nil
}

// Ring is the set's hash ring.
func (s *Set) Ring() *Ring { return s.ring }

// Names are the shard names, sorted. The slice is shared: do not modify it.
func (s *Set) Names() []string { return s.names }

// Client returns the named shard's client, or nil if there is no such shard.
func (s *Set) Client(name string) *redis.Client { return s.clients[name] }

// Clients returns every shard's client, in name order.
func (s *Set) Clients() []*redis.Client {
	out := make([]*redis.Client, len(s.names))
	for i, name := range s.names {
		out[i] = s.clients[name]
	}
	return out
}

// Except returns the clients of every shard but name, in name order (as
// redis.Cmdable, for callers that only issue commands).
func (s *Set) Except(name string) []redis.Cmdable {
	var out []redis.Cmdable
	for _, n := range s.names {
		if n != name {
			out = append(out, s.clients[n])
		}
	}
	return out
}

// Ping checks every shard at once and returns the errors of those that did
// not answer, joined.
func (s *Set) Ping(ctx context.Context) error {
	errs := make([]error, len(s.names))
	var wg sync.WaitGroup
	for i, name := range s.names {
		wg.Go(func() {
			if err := s.clients[name].Ping(ctx).Err(); err != nil {
				errs[i] = fmt.Errorf("shard %s: %w", name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close closes every client.
func (s *Set) Close() error {
	var errs []error
	for _, name := range s.names {
		errs = append(errs, s.clients[name].Close())
	}
	return errors.Join(errs...)
}
