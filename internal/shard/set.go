package shard

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Set is the named Redis shards behind a Ring: one go-redis client per shard
// (a *redis.Client, or a *redis.ClusterClient for a shard that is a Redis
// Cluster). It is safe for concurrent use; Close it once when done.
type Set struct {
	ring     *Ring
	names    []string // sorted
	serial   string   // Options.Serial, one of names
	clients  map[string]redis.UniversalClient
	clusters map[string]*cluster // the shards that are clusters
	specs    map[string]Spec
	opts     Options
}

// Options tune every shard's client. The zero value is what rain serve
// runs with by default; tests use the same, so they see go-redis's retries
// (3 per command or pipeline, after a lost reply too) as production does.
// Every script rain runs answers a re-send as it answered the first run,
// which is what makes those retries safe.
type Options struct {
	// PoolSize is connections per shard; 0 keeps go-redis's default (10 per CPU).
	PoolSize int
	// Timeout is the budget of one call to a shard: the reads, writes and
	// the wait for a pooled connection of each attempt are bounded by it,
	// and dialing by a quarter of it (a refused or unreachable shard fails
	// fast, and callers bound whole calls, retries included, with contexts
	// of this budget). Default DefaultTimeout.
	Timeout time.Duration
	// TLS is the base TLS configuration of shards whose address is a
	// rediss:// URL (its RootCAs: --redis-ca); nil: the system's roots.
	TLS *tls.Config
	// OnNode, when set, is told the durability of every primary of a
	// cluster shard that its client meets while running (a primary added,
	// a replica promoted), read when the client first connects to it: rain
	// serve logs and counts one that could lose grants. It runs on a
	// goroutine of its own.
	OnNode func(Durability)
	// Serial names the serial shard: it holds the grant serial counter
	// (internal/idgen) and its copy of a pool's record decides
	// (internal/catalog). Every instance and tool must name the same one,
	// even with different shard lists. Open refuses a name that is not
	// one of the shards (ErrUnknownSerial). Default: the first shard as
	// listed (see SerialOf).
	Serial string
}

// DefaultTimeout is Options.Timeout's default: a round trip to a healthy
// shard takes well under 10 ms, even with an fsync per batch, so half a
// second means the shard is down, frozen or stalled.
const DefaultTimeout = 500 * time.Millisecond

func (o *Options) init() {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
}

// NewClient returns a client of the shard at addr (a host:port, or the
// sentinel form of Spec.Addr), with rain's client options. Open uses it for
// every shard.
func NewClient(addr string, opts Options) *redis.Client {
	opts.init()
	o := &redis.Options{
		Addr: addr,
		// RESP2: rain uses no push notifications, and with RESP3 go-redis
		// peeks the socket for them before every command (a syscall).
		Protocol: 2,
		// Socket reads and writes honour ctx deadlines, so a hung shard
		// cannot hold a grab, or the reaper lock's extension, past them.
		ContextTimeoutEnabled: true,
		PoolSize:              opts.PoolSize,
		ReadTimeout:           opts.Timeout,
		WriteTimeout:          opts.Timeout,
		PoolTimeout:           opts.Timeout,
		DialTimeout:           opts.Timeout / 4,
		// One dial per attempt: go-redis's command retries (3) already try
		// again, and a dead shard must cost its callers little.
		DialerRetries: 1,
	}
	if isURL(addr) {
		// ParseSpecs accepts only URLs that ParseURL takes (checkURL asks
		// it); ParseURL takes the address, the user and password (AUTH),
		// and TLS for rediss://.
		if u, err := redis.ParseURL(addr); err == nil {
			o.Addr, o.Username, o.Password = u.Addr, u.Username, u.Password
			if u.TLSConfig != nil {
				cfg := &tls.Config{MinVersion: tls.VersionTLS12}
				if opts.TLS != nil {
					cfg = opts.TLS.Clone()
				}
				cfg.ServerName = u.TLSConfig.ServerName
				o.TLSConfig = cfg
			}
		}
	}
	sh, ok := Spec{Addr: addr}.Sentinel()
	if !ok {
		dial := redis.NewDialer(o)
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
				return nil, refused(err.Error())
			}
			return c, err
		}
		return redis.NewClient(o)
	}
	fo := &redis.FailoverOptions{
		MasterName: sh.Master, SentinelAddrs: sh.Sentinels, Username: sh.Username, Password: sh.Password,
		Protocol: o.Protocol, ContextTimeoutEnabled: o.ContextTimeoutEnabled, PoolSize: o.PoolSize,
		ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, PoolTimeout: o.PoolTimeout,
		DialTimeout: o.DialTimeout, DialerRetries: o.DialerRetries,
	}
	if sh.TLS {
		// One configuration for the sentinels and the servers they name:
		// each certificate is checked for the host dialled (the sentinels'
		// addresses, then the primary's as they report it).
		fo.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if opts.TLS != nil {
			fo.TLSConfig = opts.TLS.Clone()
		}
	}
	return redis.NewFailoverClient(fo)
}

// refused is the error of a dial the shard's host refused (nothing listens:
// the shard is down). go-redis retries a command whose dial failed, after a
// backoff, up to 3 times; a refusal is answered at once by the next try
// too, so those retries only hold back the answer (the batch in flight when
// a shard dies, and the claims queued behind it, waited 40-80 ms for them
// before its breaker opened). This error is not a *net.OpError, which is
// what go-redis retries, so a refused dial fails the call at once. A
// timeout, a reset or a lost reply is retried as before.
type refused string

func (e refused) Error() string { return string(e) + " (not retried)" }

// Unreachable reports whether err says a shard could not be reached: its
// dial refused or failed, or a call timed out. Commands exit with a code of
// their own for it (rain's tools tell "could not reach Redis" from a
// failure of their work).
func Unreachable(err error) bool {
	var r refused
	var op *net.OpError
	var ne net.Error
	return errors.As(err, &r) || errors.As(err, &op) && op.Op == "dial" ||
		errors.As(err, &ne) && ne.Timeout() || errors.Is(err, context.DeadlineExceeded)
}

// ErrUnknownSerial is returned by Open and SerialOf when the serial shard
// named is not one of the shards.
var ErrUnknownSerial = errors.New("shard: the serial shard is not one of the shards")

// SerialOf is the serial shard of specs (see Options.Serial): name when it
// is one of them, the first of specs as listed when name is "", and
// ErrUnknownSerial otherwise. It is the one rule; Open follows it.
func SerialOf(specs []Spec, name string) (string, error) {
	if name == "" && len(specs) > 0 {
		return specs[0].Name, nil
	}
	if slices.ContainsFunc(specs, func(sp Spec) bool { return sp.Name == name }) {
		return name, nil
	}
	return "", fmt.Errorf("%w: %q", ErrUnknownSerial, name)
}

// Open builds the ring over specs and a client per shard. It does no I/O:
// clients connect on first use.
func Open(specs []Spec, vnodes int, opts Options) (*Set, error) {
	ring, err := NewRing(specs, vnodes)
	if err != nil {
		return nil, err
	}
	opts.init()
	if opts.Serial, err = SerialOf(specs, opts.Serial); err != nil {
		return nil, err
	}
	s := &Set{ring: ring, serial: opts.Serial, clients: make(map[string]redis.UniversalClient, len(specs)), clusters: map[string]*cluster{},
		specs: map[string]Spec{}, opts: opts}
	for _, sp := range specs {
		s.specs[sp.Name] = sp
		s.names = append(s.names, sp.Name)
		if sh, ok := sp.Cluster(); ok {
			cl := newCluster(sp.Name, sh, opts)
			s.clusters[sp.Name], s.clients[sp.Name] = cl, cl.c
			continue
		}
		s.clients[sp.Name] = NewClient(sp.Addr, opts)
	}
	slices.Sort(s.names)
	return s, nil
}

// Ring is the set's hash ring.
func (s *Set) Ring() *Ring { return s.ring }

// Timeout is the budget of one call to a shard (Options.Timeout).
func (s *Set) Timeout() time.Duration { return s.opts.Timeout }

// Weight is the named shard's weight (0 for no such shard); a shard's share
// of the keys is Weight/TotalWeight.
func (s *Set) Weight(name string) int { return s.specs[name].Weight }

// TotalWeight is the sum of the shards' weights.
func (s *Set) TotalWeight() int {
	n := 0
	for _, sp := range s.specs {
		n += sp.Weight
	}
	return n
}

// Replicated reports whether the named shard runs behind Redis Sentinel,
// with replicas: writes acknowledged there should wait for a replica (WAIT).
// (A cluster shard's primaries each say so: NodeReplicated.)
func (s *Set) Replicated(name string) bool {
	_, ok := s.specs[name].Sentinel()
	return ok
}

// Serial is the serial shard's name (Options.Serial).
func (s *Set) Serial() string { return s.serial }

// Names are the shard names, sorted. The slice is shared: do not modify it.
func (s *Set) Names() []string { return s.names }

// Client returns the named shard's client (a *redis.ClusterClient for a
// cluster shard), or nil if there is no such shard.
func (s *Set) Client(name string) redis.UniversalClient {
	if c, ok := s.clients[name]; ok {
		return c
	}
	return nil
}

// Clients returns every shard's client, in name order.
func (s *Set) Clients() []redis.UniversalClient {
	out := make([]redis.UniversalClient, len(s.names))
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
			if err := s.PingShard(ctx, name); err != nil {
				errs[i] = fmt.Errorf("shard %s: %w", name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// PingShard pings the named shard: every primary of a cluster shard (the
// error then names the primary that did not answer).
func (s *Set) PingShard(ctx context.Context, name string) error {
	cl := s.clusters[name]
	if cl == nil {
		return s.clients[name].Ping(ctx).Err()
	}
	return cl.c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		if err := c.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("primary %s/%s: %w", name, c.Options().Addr, err)
		}
		return nil
	})
}

// Close closes every client.
func (s *Set) Close() error {
	var errs []error
	for _, name := range s.names {
		if cl := s.clusters[name]; cl != nil {
			errs = append(errs, cl.close())
			continue
		}
		errs = append(errs, s.clients[name].Close())
	}
	return errors.Join(errs...)
}
