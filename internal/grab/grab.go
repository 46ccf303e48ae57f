// Package grab is rain's grab path: a user's grab of a pool, from the pool's
// record (internal/catalog) to the claim at the user's home sub-pool, batched
// per shard, behind each shard's breaker and bulkhead; the spill to a
// sibling sub-pool when the home is empty; and the answers given without
// Redis (local.go). HTTP lives elsewhere (internal/api); this package speaks
// in domain values and sentinel errors.
package grab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/known"
	"rain/internal/limit"
	"rain/internal/lua"
	"rain/internal/shard"
	"rain/internal/soldout"
)

// Errors. Grab returns the exported ones; the HTTP layer turns them into
// status codes.
var (
	// ErrUnavailable is returned when a shard or the serial generator
	// cannot answer and rain knows nothing was granted: the request never
	// reached a shard, or what reached it granted nothing.
	ErrUnavailable = errors.New("grab: unavailable")
	// ErrOutcomeUnknown is returned when a step that may have granted was
	// sent and its answer was lost (a timed-out batch, a reply lost on the
	// wire): the grab may have been granted. A retry of the same grab
	// returns the grant if there is one, and never makes a second.
	ErrOutcomeUnknown = errors.New("grab: outcome unknown: the grab may have been granted, and a retry returns it")
	// ErrBusy is returned when the same user has a grab in flight that is
	// taking stock from a sibling sub-pool: retry shortly. Nothing was
	// granted by this request.
	ErrBusy = errors.New("grab: a grab of this user is in flight")

	// errNotSent wraps the error of a claim that never reached its shard.
	errNotSent = errors.New("grab: claim not sent")
	// errNotReplicated is the error of a grant its shard made but no
	// replica confirmed in time: a failover could lose it, so its outcome
	// is unknown.
	errNotReplicated = errors.New("grab: no replica confirmed the grant in time")
)

// The local memory of empty sub-pools holds every sub-pool of a pool.
const _ = uint(soldout.MaxSubPools - rain.MaxSubPools)

// Serials hands out grant serials (internal/idgen's Generator).
type Serials interface {
	Next(ctx context.Context) (int64, error)
}

// Pools is what the grab path reads of the pools' records and registry
// (internal/catalog's Catalog). Each name says whether it reads Redis.
type Pools interface {
	// Cached is a pool's record: from memory once the pool is open or
	// closed, read from Redis otherwise.
	Cached(ctx context.Context, id string) (*rain.Pool, error)
	// Read reads a pool's record from Redis (a sub-pool answered closed:
	// is the pool's life over?).
	Read(ctx context.Context, id string) (*rain.Pool, error)
	// Forget drops what is kept in memory of a pool whose life moved on.
	Forget(id string)
	// ReadListInTurn reads one shard's pool registry from Redis, the shards
	// in turn, and returns the pools every shard's latest read lists.
	ReadListInTurn(ctx context.Context) ([]string, error)
	// LastList is the pools as the registry was last read; no I/O.
	LastList() []string
	// OnOpen has f told of every pool this process opens (its preload).
	OnOpen(f func(poolID string))
}

// Config wires a Service. Serials, Shards and Pools are required; zero
// fields take the documented defaults.
type Config struct {
	// Serials hands out grant serials.
	Serials Serials
	// Shards are the shards the pools are placed on: the service runs a
	// claim lane to each.
	Shards *shard.Set
	// Pools is where pools' records are read (the same catalogue, on
	// Shards, the instance's operators and reaper use).
	Pools Pools
	// SpillValidity is how long a spill's reservation lasts (T): the claim
	// and the adopt refuse one older than this. Every instance and the
	// reaper must use the same. Default lua.SpillValidity.
	SpillValidity time.Duration
	// Places, when set, reports the request places of the worker pool
	// grabs run on: those held now, and how many there are (pool.Pool's
	// Places). While they run short, a shard may hold at most its share of
	// them (by weight, at least 2) in claims queued or in flight, so a shard
	// that stalls under a flood leaves the others their places (the
	// bulkhead; see batcher.admit). Nil: no such bound.
	Places func() (inUse, limit int64)
	// BreakerCooldown is how long a shard's breaker stays open after a
	// failed call before it lets a probe through. Default 1s.
	BreakerCooldown time.Duration
	// OnBatch, when set, is told of every batch of claims a shard answered
	// or failed: the shard, the claims in it, the round trip, and whether
	// the shard failed to answer (network error or timeout). It runs on the
	// shard's lane: it must be quick (a histogram's Observe).
	OnBatch func(shard string, claims int, took time.Duration, failed bool)
	// Logger for the background work (local answers, holders). Default: discard.
	Logger *slog.Logger
	// Held, when set, says whether a shard (by name; a cluster shard's
	// name for each of its primaries) must be sent no claim yet: its
	// durability is not known (it did not answer rain serve's check at
	// start, under --durability strict). Its claims are refused unsent,
	// as with its breaker open: nothing is granted there.
	Held func(shard string) bool
	// Form is how the grants made are written (lua.Form): the zero Form is
	// what every rain settle pays and every reaper releases. Each other
	// form is set only once every rain settle (a packed outbox) or every
	// rain serve (a batched deadline index) on these shards reads it (rain
	// serve --outbox, --deadline-index).
	Form lua.Form
}

// Service grabs from pools. Build it with New, stop it with Close.
type Service struct {
	shards   *shard.Set
	cat      Pools // Config.Pools
	serials  Serials
	valid    time.Duration // Config.SpillValidity
	log      *slog.Logger
	cfg      Config
	batchers map[string]*batcher   // by shard name, the shards that are not clusters; immutable after New
	nodes    map[string]*nodeLanes // by shard name, the cluster shards; the map is immutable after New

	mu    sync.RWMutex         // guards pools
	pools map[string]*poolView // open pools; an open pool's record never changes

	local local     // the answers given without Redis
	marks *marker   // the due marks of sub-pools granted or spilled from
	cpu   *cpuWatch // whether the process is short of CPU (the lanes' linger)

	// Everything the service runs in the background (the lanes, breaker
	// probes, readers of holders) starts through goBackground; Close ends
	// it (stopCtx) and waits for it. One stop mechanism.
	bgMu    sync.Mutex // orders bg's Go against Close's stop and Wait
	bg      sync.WaitGroup
	stopCtx context.Context // done when Close begins
	stop    context.CancelFunc
}

// poolView is what the grab path needs of an open pool, resolved once.
type poolView struct {
	rec      *rain.Pool
	batchers []*batcher              // of sub-pool j; nil on a cluster shard (its primary's: batcherFor)
	clients  []redis.UniversalClient // of sub-pool j (a cluster shard's client)
	keys     []rain.Keys             // of sub-pool j
}

func (c *Config) init() {
	if c.BreakerCooldown <= 0 {
		c.BreakerCooldown = time.Second
	}
	if c.SpillValidity <= 0 {
		c.SpillValidity = lua.SpillValidity
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// New returns a service over cfg.Shards. It starts the claim lanes; Close
// stops them.
func New(cfg Config) *Service {
	cfg.init()
	shards := cfg.Shards
	s := &Service{shards: shards, cat: cfg.Pools, serials: cfg.Serials, valid: cfg.SpillValidity, log: cfg.Logger,
		pools: map[string]*poolView{}, batchers: map[string]*batcher{},
		local: local{known: known.New(known.Config{}), empty: soldout.New(soldout.Config{}),
			lookups: limit.New(limit.Config{Rate: unknownLookups, Burst: unknownLookups, MaxKeys: 1})}}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	s.cfg = cfg
	s.marks = newMarker(shards, cfg.Logger)
	s.goBackground(func() { s.marks.run(s.stopCtx.Done()) })
	s.cpu = newCPUWatch()
	s.goBackground(func() { s.cpu.run(s.stopCtx.Done()) })
	cfg.Pools.OnOpen(s.local.known.Add)
	s.nodes = map[string]*nodeLanes{}
	for _, name := range shards.Names() {
		if shards.IsCluster(name) {
			s.nodes[name] = &nodeLanes{byAddr: map[string]*batcher{}}
			continue
		}
		s.batchers[name] = s.newBatcher(name, "", shards.Client(name), shards.Replicated(name), 1)
	}
	return s
}

// newBatcher makes and starts the batcher of a shard (cluster "") or of a
// cluster shard's primary (name "cluster/addr"), on client c; its share of
// the request places is its shard's weight divided by parts (the
// cluster's primaries).
func (s *Service) newBatcher(name, cluster string, c redis.UniversalClient, replicated bool, parts int64) *batcher {
	shards := s.shards
	probe := func() bool {
		ctx, cancel := context.WithTimeout(s.stopCtx, shards.Timeout())
		defer cancel()
		return c.Ping(ctx).Err() == nil
	}
	start := func(f func()) { s.goBackground(f) }
	b := &batcher{name: name, c: c, reqs: make(chan *claimReq, queuePerShard), stop: s.stopCtx.Done(),
		budget: shards.Timeout(), replicated: replicated, form: s.cfg.Form, br: newBreaker(s.cfg.BreakerCooldown, probe, start),
		onBatch: s.cfg.OnBatch, cluster: cluster, shards: shards, cpu: s.cpu}
	if held := s.cfg.Held; held != nil {
		shardName := name
		if cluster != "" {
			shardName = cluster
		}
		b.held = func() bool { return held(shardName) }
	}
	placed := name
	if cluster != "" {
		placed = cluster
	}
	b.mark = func(meta string) { s.marks.mark(placed, meta) }
	if s.cfg.Places != nil {
		shard := name
		if cluster != "" {
			shard = cluster
		}
		w, total := int64(shards.Weight(shard)), int64(shards.TotalWeight())*max(parts, 1)
		b.places = s.cfg.Places
		b.share = func(limit int64) int64 { return max(2, (limit*w+total-1)/total) }
	}
	for range lanesPerShard {
		s.goBackground(b.lane)
	}
	return b
}

// Close stops the claim lanes and the background work, and waits for them.
// Call it after the last Grab has returned (after the HTTP server's
// Shutdown).
func (s *Service) Close() {
	s.bgMu.Lock()
	s.stop()
	s.bgMu.Unlock()
	s.bg.Wait()
}

// ShortOfCPU reports whether the process is short of CPU, so that the
// claim lanes linger to fill their batches (see batcher.shortOfCPU).
func (s *Service) ShortOfCPU() bool { return s.cpu.short.Load() }

// goBackground runs f in the background unless Close has begun (then it
// reports false); Close cancels stopCtx and waits for f.
func (s *Service) goBackground(f func()) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.stopCtx.Err() != nil {
		return false
	}
	s.bg.Go(f)
	return true
}

// Outcome is what a grab did.
type Outcome uint8

// Grab outcomes; the HTTP layer maps each to its status and code.
const (
	Granted        Outcome = iota + 1 // a new grant
	AlreadyGranted                    // the user's first grant, again
	SoldOut                           // no stock left
	NotFound                          // no such pool
	NotStarted                        // before the pool's start (or while it loads); see Result.RetryAfter
	Ended                             // after the pool's end
)

// Result of a grab. Amount, Serial and ExpiresAt are set with a grant.
type Result struct {
	Outcome    Outcome
	Amount     int64
	Serial     int64
	ExpiresAt  time.Time
	RetryAfter time.Duration // NotStarted: until the start
}

// Grab claims a packet of poolID for userID, or returns the grant the user
// already holds: Begin, then Wait. Ids must be valid (rain.ValidID). It
// returns ErrUnavailable when a shard or the serial generator cannot answer
// and nothing was granted, ErrOutcomeUnknown when a step that may have
// granted lost its answer (a retry returns the grant if there is one), and
// ErrBusy while the user's own spill is in flight.
//
// The common path is one script on one shard: the user's home sub-pool comes
// from a hash of the user id, and dedup lives there.
func (s *Service) Grab(ctx context.Context, poolID, userID string) (Result, error) {
	return s.Begin(ctx, poolID, userID).Wait()
}

// Pending is a grab that Begin has started: its claim is queued at its
// home sub-pool's shard, or its answer is known already. Wait returns it.
type Pending struct {
	s      *Service
	p      *poolView
	req    *claimReq // nil when res and err are the answer
	ctx    context.Context
	res    Result
	err    error
	user   string
	j      int
	serial int64
	token  string
}

// Begin starts a grab: the answers rain gives without Redis (local.go),
// the serial, and the claim queued at the user's home sub-pool's shard. It
// does not wait for the shard: the worker pool runs Begin, and the request
// waits for the shard's answer in Wait, holding no worker (a shard that
// stalls costs the others none). ctx bounds the whole grab.
func (s *Service) Begin(ctx context.Context, poolID, userID string) Pending {
	if s.local.unknown(poolID) {
		return Pending{res: Result{Outcome: NotFound}}
	}
	p, err := s.pool(ctx, poolID)
	switch {
	case errors.Is(err, rain.ErrNotFound):
		return Pending{res: Result{Outcome: NotFound}}
	case err != nil:
		return Pending{err: err}
	case p.rec.State.Over():
		return Pending{res: Result{Outcome: Ended}} // closing or closed
	case p.rec.State != rain.Open:
		return Pending{res: Result{Outcome: NotStarted, RetryAfter: time.Second}}
	case s.soldOutHere(p, userID):
		return Pending{res: Result{Outcome: SoldOut}}
	}
	serial, err := s.serials.Next(ctx)
	if err != nil {
		return Pending{err: fmt.Errorf("%w: serial: %w", ErrUnavailable, err)}
	}
	j := p.rec.Home(userID)
	var token string
	if len(p.keys) > 1 {
		// The serial is unique across instances: it names the spill too.
		token = strconv.FormatInt(serial, 10)
	}
	b, err := s.batcherFor(ctx, p, j)
	if err != nil {
		return Pending{err: fmt.Errorf("%w: claim %s sub-pool %d: %w", ErrUnavailable, poolID, j, err)}
	}
	r, err := b.enqueue(ctx, &p.keys[j], userID, serial, token, s.valid.Milliseconds())
	if err != nil {
		return Pending{err: fmt.Errorf("%w: claim %s sub-pool %d: %w", claimOutcome(err), poolID, j, err)}
	}
	return Pending{s: s, p: p, req: r, ctx: ctx, user: userID, j: j, serial: serial, token: token}
}

// Wait waits for the grab's claim to be answered, spills to a sibling
// sub-pool when the home has no stock, and returns the grab's answer, as
// Grab does. Call it once.
func (g Pending) Wait() (Result, error) {
	if g.req == nil {
		return g.res, g.err
	}
	s, p := g.s, g.p
	poolID := p.rec.ID()
	c, err := g.req.wait()
	if err != nil {
		return Result{}, fmt.Errorf("%w: claim %s sub-pool %d: %w", claimOutcome(err), poolID, g.j, err)
	}
	switch c.Outcome {
	case lua.Reserved:
		if c, err = s.spill(g.ctx, p, g.user, g.j, g.serial, g.token); err != nil {
			return Result{}, err
		}
	case lua.Busy:
		return Result{}, ErrBusy
	}
	switch c.Outcome {
	case lua.Granted, lua.Already:
		o := Granted
		if c.Outcome == lua.Already {
			o = AlreadyGranted
		}
		return Result{Outcome: o, Amount: c.Amount, Serial: c.Serial, ExpiresAt: time.UnixMilli(c.DeadlineMS).UTC()}, nil
	case lua.Empty:
		// The home had none and, for a pool of several sub-pools, no
		// sibling had any either (spill marked them).
		s.local.empty.MarkEmpty(poolID, g.j)
		return Result{Outcome: SoldOut}, nil
	case lua.NotStarted:
		return Result{Outcome: NotStarted, RetryAfter: time.Duration(c.WaitMS) * time.Millisecond}, nil
	case lua.Ended:
		return Result{Outcome: Ended}, nil
	default: // lua.Closed: the sub-pool is loading, or gone with its pool's close
		if rec, err := s.cat.Read(g.ctx, poolID); err == nil && rec.State.Over() {
			s.forget(poolID)
			return Result{Outcome: Ended}, nil
		}
		return Result{Outcome: NotStarted, RetryAfter: time.Second}, nil
	}
}

// forget drops what the instance keeps of a pool whose life moved on (it
// was ended or closed): its view, its record, its local answers.
func (s *Service) forget(poolID string) {
	s.mu.Lock()
	p := s.pools[poolID]
	delete(s.pools, poolID)
	s.mu.Unlock()
	s.cat.Forget(poolID)
	if p != nil {
		for j := range p.keys {
			s.local.stockBack(poolID, j)
		}
	}
}

// claimOutcome is what the error of a step that may grant says was
// granted: ErrUnavailable when the step certainly did not run or ran and
// refused (it never reached the shard, or the shard answered with an
// error: scripts fail before they write), ErrOutcomeUnknown when it may
// have run (its answer was lost: a timeout, a broken connection, whatever
// go-redis's retries last saw).
func claimOutcome(err error) error {
	var rerr redis.Error
	switch {
	case errors.Is(err, errNotSent):
		return ErrUnavailable
	case errors.As(err, &rerr) && !retriedReply(err):
		return ErrUnavailable
	}
	return ErrOutcomeUnknown
}

// retriedReply reports whether err is a server's answer go-redis retries
// a call on (its shouldRetry: the server loading, read-only, its master
// down, the cluster down, TRYAGAIN, its clients at maxclients, too few
// replicas for min-replicas-to-write): this answer ran nothing, but an
// earlier try of the same batch, whose reply was lost, may have.
func retriedReply(err error) bool {
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN",
		"max number of clients reached", "NOREPLICAS"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// pool returns the pool's grab-path view, from memory once it is open. A
// pool that is not open yet is read again on every call.
func (s *Service) pool(ctx context.Context, id string) (*poolView, error) {
	s.mu.RLock()
	p := s.pools[id]
	s.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	rec, err := s.cat.Cached(ctx, id)
	if errors.Is(err, rain.ErrUnavailable) {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err != nil {
		return nil, err
	}
	s.local.known.Add(id) // found: if the filter had not heard of it, now it has
	p = &poolView{rec: rec}
	if rec.State.Over() {
		s.local.known.Add(id)
		return p, nil // answered ended from the record: no shard is asked
	}
	for j, name := range rec.Placement {
		b := s.batchers[name]
		if b == nil && s.nodes[name] == nil {
			return nil, fmt.Errorf("%w: pool %s sub-pool %d is on shard %s, which is not configured", ErrUnavailable, id, j, name)
		}
		p.batchers = append(p.batchers, b)
		p.clients = append(p.clients, s.shards.Client(name))
		p.keys = append(p.keys, rec.SubPool(j).Keys())
	}
	if rec.State == rain.Open {
		s.mu.Lock()
		s.pools[id] = p
		s.mu.Unlock()
	}
	s.local.known.Add(id)
	return p, nil
}
