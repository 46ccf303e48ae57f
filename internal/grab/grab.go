package grab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"rain/internal/events"
	"rain/internal/known"
	"rain/internal/lua"
	"rain/internal/shard"
	"rain/internal/soldout"
)

// Serials hands out grant serials (internal/idgen's Generator).
type Serials interface {
	Next(ctx context.Context) (int64, error)
}

// Config wires a Service. Zero fields take the documented defaults.
type Config struct {
	// Serials hands out grant serials. Nil for a service that only
	// preloads, reports and audits (Grab then fails).
	Serials Serials
	// Arbiter names the shard whose pool records decide: a preload writes a
	// pool's record there first, and what is stored there wins. Every
	// instance must name the same one (rain uses the serial shard), even
	// with different shard lists. Default: the first shard by name.
	Arbiter string
	// SpillAge is how long a spill's transfer stays in flight before the
	// reaper resolves it by the home's verdict (which refuses a token the
	// home has not decided). Safety does not depend on it; a short age only
	// turns away spills still in progress. Default 8s.
	SpillAge time.Duration
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
}

// Service grabs from, preloads, reports on and audits pools.
type Service struct {
	shards   *shard.Set
	serials  Serials
	arbiter  string
	log      *slog.Logger
	batchers map[string]*batcher // by shard name; immutable after New
	stop     chan struct{}       // closed by Close
	stopOnce sync.Once           // guards close(stop)
	lanes    sync.WaitGroup      // batcher lanes

	mu    sync.RWMutex         // guards pools
	pools map[string]*poolView // open pools; an open pool's record never changes

	// known answers "no such pool" without Redis; empty remembers sub-pools
	// that answered empty, briefly, so a sold-out pool is answered locally.
	// Run keeps both current across instances.
	known   *known.Filter
	empty   *soldout.Cache
	holders sync.Map // pool id -> *holderState, for sold-out pools

	// Background work (readers of holders, breaker probes) starts through
	// goBackground; Close ends it (stopCtx) and waits for it.
	bgMu    sync.Mutex // orders bg's Go against Close's stopBg and Wait
	bg      sync.WaitGroup
	stopCtx context.Context // done when Close begins
	stopBg  context.CancelFunc

	// afterTrip, when set (tests), runs after each pipelined round trip of a
	// sub-pool's preload with the next batch it lacks; an error aborts the
	// preload there, as a crash would.
	afterTrip func(subPool int, nextBatch int64) error

	// spillValidity is how long a spill reservation lasts (T); spillAge is
	// how long a transfer stays in flight before the reaper resolves it (it
	// asks the home for its verdict, which refuses the token if the home has
	// not decided it: safe at any age, but an early verdict would turn away
	// a spill still in progress). Tests shorten them.
	spillValidity, spillAge time.Duration
	dueMu                   sync.Mutex                // guards due
	due                     map[lua.SubPool]time.Time // when each sub-pool next needs the reaper's sweep
	listed                  atomic.Pointer[[]string]  // the pools as Run's refresh last listed them
	warm                    atomic.Bool               // the known filter may answer not_found (see Run)

	// spillHook, when set (tests), runs after each step of a spill
	// ("reserved", "taken", "adopted", "acked"); an error stops the grab
	// there, as a crash would.
	spillHook func(step string) error
}

// Spill timing defaults.
const (
	defaultSpillValidity = 3 * time.Second
	defaultSpillAge      = 8 * time.Second
)

// ErrBusy is returned by Grab when the same user has a grab in flight that
// is taking stock from a sibling sub-pool: retry shortly. Nothing was
// granted by this request.
var ErrBusy = errors.New("a grab of this user is in flight")

// poolView is what the grab path needs of an open pool, resolved once.
type poolView struct {
	rec      *record
	batchers []*batcher      // of sub-pool j
	clients  []*redis.Client // of sub-pool j
	keys     []lua.Keys      // of sub-pool j
}

// home is the sub-pool that holds userID's grant in a pool of k sub-pools.
func home(userID string, k int) int {
	return int(xxhash.Sum64String(userID) % uint64(k))
}

// New returns a service over shards. It starts the claim batchers; Close
// stops them.
func New(shards *shard.Set, cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Arbiter == "" || shards.Client(cfg.Arbiter) == nil {
		cfg.Arbiter = shards.Names()[0]
	}
	if cfg.SpillAge <= 0 {
		cfg.SpillAge = defaultSpillAge
	}
	if cfg.BreakerCooldown <= 0 {
		cfg.BreakerCooldown = time.Second
	}
	s := &Service{shards: shards, serials: cfg.Serials, arbiter: cfg.Arbiter, log: cfg.Logger,
		pools: map[string]*poolView{}, batchers: map[string]*batcher{}, stop: make(chan struct{}),
		due:           map[lua.SubPool]time.Time{},
		spillValidity: defaultSpillValidity, spillAge: cfg.SpillAge,
		known: known.New(known.Config{}), empty: soldout.New(soldout.Config{})}
	s.stopCtx, s.stopBg = context.WithCancel(context.Background())
	for _, name := range shards.Names() {
		c := shards.Client(name)
		probe := func() bool {
			ctx, cancel := context.WithTimeout(s.stopCtx, shards.Timeout())
			defer cancel()
			return c.Ping(ctx).Err() == nil
		}
		start := func(f func()) { s.goBackground(f) }
		b := &batcher{name: name, c: c, reqs: make(chan *claimReq, queuePerShard), stop: s.stop,
			budget: shards.Timeout(), replicated: shards.Replicated(name), br: newBreaker(cfg.BreakerCooldown, probe, start),
			onBatch: cfg.OnBatch}
		if cfg.Places != nil {
			w, total := int64(shards.Weight(name)), int64(shards.TotalWeight())
			b.places = cfg.Places
			b.share = func(limit int64) int64 { return max(2, (limit*w+total-1)/total) }
		}
		s.batchers[name] = b
		for range lanesPerShard {
			s.lanes.Go(b.lane)
		}
	}
	return s
}

// Close stops the claim batchers and waits for them. Call it after the last
// Grab has returned (after the HTTP server's Shutdown).
func (s *Service) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.bgMu.Lock()
	s.stopBg()
	s.bgMu.Unlock()
	s.lanes.Wait()
	s.bg.Wait()
}

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
// already holds: Begin, then Wait. Ids must be valid (ValidID). It returns
// ErrUnavailable when a shard or the serial generator cannot answer and
// nothing was granted, ErrOutcomeUnknown when a step that may have granted
// lost its answer (a retry returns the grant if there is one), and ErrBusy
// while the user's own spill is in flight.
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

// Begin starts a grab: the answers rain gives without Redis (see the local
// answers), the serial, and the claim queued at the user's home sub-pool's
// shard. It does not wait for the shard: the worker pool runs Begin, and
// the request waits for the shard's answer in Wait, holding no worker (a
// shard that stalls costs the others none). ctx bounds the whole grab.
func (s *Service) Begin(ctx context.Context, poolID, userID string) Pending {
	if s.warm.Load() && !s.known.MayContain(poolID) {
		return Pending{res: Result{Outcome: NotFound}} // unknown or forged: no Redis
	}
	p, err := s.pool(ctx, poolID)
	switch {
	case errors.Is(err, ErrNotFound):
		return Pending{res: Result{Outcome: NotFound}}
	case err != nil:
		return Pending{err: err}
	case p.rec.state != stateOpen:
		return Pending{res: Result{Outcome: NotStarted, RetryAfter: time.Second}}
	case s.empty.AllEmpty(poolID, len(p.keys)) && s.surelyNotHolder(p, userID):
		// Every sub-pool answered empty within the last second, no release
		// has returned stock since, and this user holds no grant here: the
		// flood after a sell-out is answered without Redis.
		return Pending{res: Result{Outcome: SoldOut}}
	}
	serial, err := s.serials.Next(ctx)
	if err != nil {
		return Pending{err: fmt.Errorf("%w: serial: %w", ErrUnavailable, err)}
	}
	j := home(userID, len(p.keys))
	var token string
	if len(p.keys) > 1 {
		// The serial is unique across instances: it names the spill too.
		token = strconv.FormatInt(serial, 10)
	}
	r, err := p.batchers[j].enqueue(ctx, &p.keys[j], userID, serial, token, s.spillValidity.Milliseconds())
	if err != nil {
		return Pending{err: fmt.Errorf("%w: claim %s sub-pool %d: %w", sentErr(err), poolID, j, err)}
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
	s, p, ctx := g.s, g.p, g.ctx
	poolID := p.rec.spec.PoolID
	c, err := g.req.wait()
	if err != nil {
		return Result{}, fmt.Errorf("%w: claim %s sub-pool %d: %w", sentErr(err), poolID, g.j, err)
	}
	switch c.Outcome {
	case lua.Reserved:
		if err := s.step("reserved"); err != nil {
			return Result{}, err
		}
		c, err = s.spill(ctx, p, g.user, g.j, g.serial, g.token)
		if err != nil {
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
		s.empty.MarkEmpty(poolID, g.j)
		return Result{Outcome: SoldOut}, nil
	case lua.NotStarted:
		return Result{Outcome: NotStarted, RetryAfter: time.Duration(c.WaitMS) * time.Millisecond}, nil
	case lua.Ended:
		return Result{Outcome: Ended}, nil
	default: // lua.Closed: the sub-pool is still loading
		return Result{Outcome: NotStarted, RetryAfter: time.Second}, nil
	}
}

// sentErr classifies the error of a step that may grant: ErrUnavailable
// when the step certainly did not run or ran and refused (it never reached
// the shard, or the shard answered with an error: scripts fail before they
// write), ErrOutcomeUnknown when it may have run (its answer was lost: a
// timeout, a broken connection, whatever go-redis's retries last saw).
func sentErr(err error) error {
	var rerr redis.Error
	if errors.Is(err, errNotSent) || errors.As(err, &rerr) {
		return ErrUnavailable
	}
	return ErrOutcomeUnknown
}

// pool returns the pool's grab-path view, from the cache when it is open.
// A pool that is not open yet is read again on every call.
func (s *Service) pool(ctx context.Context, id string) (*poolView, error) {
	s.mu.RLock()
	p := s.pools[id]
	s.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	rec, err := s.findRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	p = &poolView{rec: rec}
	for j, name := range rec.placement {
		b := s.batchers[name]
		if b == nil {
			return nil, fmt.Errorf("%w: pool %s sub-pool %d is on shard %s, which is not configured", ErrUnavailable, id, j, name)
		}
		p.batchers = append(p.batchers, b)
		p.clients = append(p.clients, s.shards.Client(name))
		p.keys = append(p.keys, lua.SubPool{Pool: id, Index: j}.Keys())
	}
	if rec.state == stateOpen {
		s.mu.Lock()
		s.pools[id] = p
		s.mu.Unlock()
	}
	s.known.Add(id)
	return p, nil
}

// findRecord reads the pool's record: the arbiter's, which decides, or,
// when the arbiter has none, the other shards' (an open copy before one
// still loading: a preload opens the record on each shard in turn). A
// record the other shards hold and an arbiter that answered lacks (it lost
// its data) is written back to the arbiter, where none is, so the pool
// never vanishes behind it. ErrNotFound when no shard that answered has
// it; ErrUnavailable when none has it and some did not answer.
func (s *Service) findRecord(ctx context.Context, id string) (*record, error) {
	key := recordKey(id)
	m, err := s.shards.Client(s.arbiter).HGetAll(ctx, key).Result()
	if err == nil && len(m) > 0 {
		return parseRecord(m)
	}
	var down []error
	if err != nil {
		down = append(down, fmt.Errorf("arbiter %s: %w", s.arbiter, err))
	}
	arbiterEmpty := err == nil
	var found map[string]string
	for _, name := range s.shards.Names() {
		if name == s.arbiter {
			continue
		}
		o, err := s.shards.Client(name).HGetAll(ctx, key).Result()
		if err != nil {
			down = append(down, fmt.Errorf("shard %s: %w", name, err))
			continue
		}
		if len(o) > 0 && (found == nil || found["state"] != stateOpen && o["state"] == stateOpen) {
			found = o
		}
	}
	if found == nil {
		if len(down) > 0 {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(down...))
		}
		return nil, ErrNotFound
	}
	if arbiterEmpty {
		if stored, err := s.putRecord(ctx, s.shards.Client(s.arbiter), id, found); err == nil {
			return stored, nil // what is stored there wins, written meanwhile or now
		}
	}
	return parseRecord(found)
}

// client is the shard client of the record's sub-pool j.
func (s *Service) client(rec *record, j int) *redis.Client {
	return s.shards.Client(rec.placement[j])
}

// Run keeps this instance's local answers current until ctx ends: it hears
// rain:events on every shard (a new pool is known at once; stock returned to
// a sub-pool, or a new holder, makes it no longer known empty and drops its
// holders) and lists the pool registries every 2 s, so a lost notice
// costs at most that. Run it in one goroutine beside serving grabs; it
// returns when ctx ends.
//
// The known-pools filter answers unknown pools without Redis only once it
// is warm: after a registry read that began when every shard had confirmed
// its subscription to the notices (so a pool preloaded before that read is
// in it, and one preloaded after is notified), or after the second read
// when some shard never confirmed (then a lost notice is covered by the
// next read, as ever). Until then an unknown pool is looked up on the
// shards: an instance just started never answers not_found for a pool
// preloaded a moment before.
func (s *Service) Run(ctx context.Context) {
	shards := int64(len(s.shards.Names()))
	var subscribed, reads atomic.Int64
	allSubscribed := make(chan struct{})
	list := func(ctx context.Context) ([]string, error) {
		ready := subscribed.Load() == shards || reads.Load() >= 1
		ids, err := s.refreshList(ctx)
		if err == nil {
			if reads.Add(1); ready {
				s.warm.Store(true)
			}
		}
		return ids, err
	}
	refresh := known.NewSync(s.known, list, known.SyncConfig{Logger: s.log})
	var wg sync.WaitGroup
	wg.Go(func() {
		// The first read waits for the subscriptions (a second at most:
		// a shard down at the start is subscribed to when it answers).
		select {
		case <-allSubscribed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
		refresh.Run(ctx)
	})
	events.Listen(ctx, s.shards.Clients(), events.Config{Logger: s.log, Subscribed: func() {
		if subscribed.Add(1) == shards {
			close(allSubscribed)
		}
	}}, events.Handlers{
		Pool: s.known.Add,
		Stock: func(pool string, j int) {
			s.empty.Forget(pool, j)
			s.dropHolders(pool, j)
		},
	})
	wg.Wait()
}
