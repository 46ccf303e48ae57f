// Package instance builds one rain instance: every component rain serve
// runs, wired once, by one constructor, so that rain serve, the API's tests
// and the chaos tests run the same thing.
//
// An instance is the shards' clients, the grant serial generator (on the
// serial shard, watermarks on the others), the pool catalogue, the grab
// path, the worker pool grabs run on, the reaper, the metrics registry, the
// dashboard's timeline and the HTTP API. The listener and the HTTP server
// are the caller's (rain serve's, or a test's httptest server).
package instance

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"rain/internal/api"
	"rain/internal/catalog"
	"rain/internal/dash"
	"rain/internal/grab"
	"rain/internal/idgen"
	"rain/internal/limit"
	"rain/internal/lock"
	"rain/internal/lua"
	"rain/internal/metrics"
	"rain/internal/pool"
	"rain/internal/reaper"
	"rain/internal/settle"
	"rain/internal/shard"
)

// Config is what an instance is built from; rain serve fills it from its
// flags. Zero fields take the documented defaults.
type Config struct {
	// Shards, required, are opened with ShardOptions (rain serve's client
	// options, go-redis's retries included, unless a test says otherwise;
	// its Serial names the serial shard, which holds the serial counter
	// and arbitrates pool records: by default the first of Shards).
	Shards       []shard.Spec
	ShardOptions shard.Options
	// Pool bounds the worker pool grabs run on. Nil runs grabs on the
	// handler's goroutine, unbounded (rain serve --workers=off).
	Pool *pool.Config
	// API is the HTTP layer's configuration (admin tokens, user auth, rate
	// limits, access log); the instance fills in what it builds: Grabber,
	// Pools, Ready, Runner, Metrics, Timeline and Logger.
	API api.Config
	// Relaxed says whether shards were let through --durability relaxed
	// though some can lose grants (rain_durability_relaxed; nil: none).
	// A shard that did not answer at start may be found so later.
	Relaxed func() bool
	// Held, when set, says whether a shard must be sent no claim yet
	// (grab.Config.Held).
	Held func(shard string) bool
	// Build is the version the metrics report.
	Build metrics.Build
	// ReaperRetry is how long an instance waits between two tries at the
	// reaper's lock (jittered to 0.5-1.5 times). Default 4s.
	ReaperRetry time.Duration
	// ClusterWatch is how often the primaries of each cluster shard are
	// read to notice a change (one CLUSTER SHARDS); 10s when zero.
	ClusterWatch time.Duration
	// Reaper tunes the reaper; its Logger is the instance's.
	Reaper reaper.Config
	// Books, when set, is the system of record closes reconcile with and
	// record the accounts in (internal/postgres).
	Books catalog.Books
	// Settle, when set, runs a settlement worker in the instance, paying
	// into this sink (rain serve's first run, on embedded shards). Nil:
	// settlement runs apart (rain settle).
	Settle settle.Sink
	// SettleConfig tunes that worker; its Logger is the instance's.
	SettleConfig settle.Config
	// SpillValidity is the spill reservations' validity (T) for the grab
	// path and the reaper alike. Default lua.SpillValidity.
	SpillValidity time.Duration
	// Form is how the grants made are written (grab.Config.Form).
	Form lua.Form
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Instance is one rain instance. Build it with New; Start its background
// work; Close it after the HTTP server has shut down.
type Instance struct {
	Shards   *shard.Set
	Serials  *idgen.Generator
	Catalog  *catalog.Catalog
	Grabs    *grab.Service
	Workers  *pool.Pool // nil with Config.Pool nil
	Reaper   *reaper.Reaper
	Metrics  *metrics.Registry
	Timeline *dash.Timeline
	API      *api.Server
	Settler  *settle.Worker // nil without Config.Settle

	log            *slog.Logger
	weakPrimaries  atomic.Int64       // cluster primaries met while running that could lose grants
	clusterChanges atomic.Int64       // changes seen in the primaries of cluster shards
	clusterWatch   time.Duration      // how often they are read
	stopBg         context.CancelFunc // ends the background work; nil before Start
	bg             sync.WaitGroup
	closeOnce      sync.Once
}

func (c *Config) init() {
	if c.ReaperRetry <= 0 {
		c.ReaperRetry = 4 * time.Second
	}
	if c.ClusterWatch <= 0 {
		c.ClusterWatch = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// New builds an instance. It does no I/O but what its components do when
// built: the serial generator reserves its first segment.
func New(cfg Config) (*Instance, error) {
	cfg.init()
	if len(cfg.Shards) == 0 {
		return nil, errors.New("instance: no shards")
	}
	in := &Instance{log: cfg.Logger, clusterWatch: cfg.ClusterWatch}
	opts := cfg.ShardOptions
	// A cluster primary met while running (added, or a replica promoted)
	// is checked as the shards were at start: logged and counted when it
	// could lose grants.
	opts.OnNode = func(d shard.Durability) {
		if d.Err == nil && d.Durable() {
			return
		}
		in.weakPrimaries.Add(1)
		cfg.Logger.Warn("a cluster primary met while running could lose grants: make it appendonly yes, appendfsync always",
			"primary", d.Shard, "durability", d.String())
	}
	set, err := shard.Open(cfg.Shards, 0, opts)
	if err != nil {
		return nil, err
	}
	in.Shards = set
	if err := in.build(cfg); err != nil {
		in.closeParts()
		return nil, err
	}
	return in, nil
}

// build makes the components, in the order they depend on each other.
func (in *Instance) build(cfg Config) error {
	set := in.Shards
	in.Metrics = metrics.New(cfg.Build)
	in.Metrics.Durability(cfg.Relaxed)
	in.Metrics.Counter("rain_shard_cluster_changes_total", "Changes seen in the list of a cluster shard's primaries (a primary added or removed, a replica promoted).",
		func() float64 { return float64(in.clusterChanges.Load()) })
	in.Metrics.Counter("rain_shard_weak_primaries_total", "Cluster primaries met while running (added, or a replica promoted) whose persistence could lose acknowledged grants.",
		func() float64 { return float64(in.weakPrimaries.Load()) })
	// Serials come from the serial shard, with watermark copies on the others.
	ctx, cancel := context.WithTimeout(context.Background(), 10*set.Timeout())
	gen, err := idgen.ForShards(ctx, set, idgen.Config{})
	cancel()
	if err != nil {
		return err
	}
	in.Serials = gen
	in.Metrics.Serials(gen.Stats)
	in.Catalog = catalog.New(set, catalog.Config{Books: cfg.Books, Logger: cfg.Logger})
	gcfg := grab.Config{Serials: gen, Shards: set, Pools: in.Catalog, SpillValidity: cfg.SpillValidity, Logger: cfg.Logger,
		OnBatch: in.Metrics.Batches(set.Names()), Form: cfg.Form, Held: cfg.Held}
	if cfg.Pool != nil {
		pc := *cfg.Pool
		pc.Logger = cfg.Logger
		if in.Workers, err = pool.New(pc); err != nil {
			return err
		}
		gcfg.Places = in.Workers.Places // each shard's bulkhead: its share of the places
		in.Metrics.Pool(in.Workers.Stats)
	}
	in.Grabs = grab.New(gcfg)
	in.Metrics.Shards(in.Grabs.ShardStats, set)
	in.Metrics.ShortOfCPU(in.Grabs.ShortOfCPU)
	in.Metrics.Stock(in.Grabs.Stock)
	// The reaper competes for its lock in every instance; one sweeps. An
	// instance waiting for the lock tries every few seconds: a crashed
	// leader is taken over within TTL + ReaperRetry, and the waiting costs
	// each shard one attempt per instance every few seconds.
	rc := cfg.Reaper
	rc.Logger, rc.SpillValidity = cfg.Logger, cfg.SpillValidity
	in.Reaper = reaper.New(set, in.Catalog, lock.New(set.Clients(), lock.Config{Logger: cfg.Logger, RetryDelay: cfg.ReaperRetry}), rc)
	in.Metrics.Reaper(in.Reaper.Stats)
	if cfg.Settle != nil {
		sc := cfg.SettleConfig
		sc.Logger = cfg.Logger
		in.Settler = settle.New(set, in.Catalog, cfg.Settle, sc)
		in.Metrics.Settle(in.Settler.Stats)
	}
	in.Timeline = dash.NewTimeline(in.Metrics.Gatherer())
	acfg := cfg.API
	acfg.Grabber, acfg.Pools, acfg.Ready = in.Grabs, in.Catalog, in.Grabs.Ready
	acfg.Metrics, acfg.Timeline, acfg.Logger = in.Metrics, in.Timeline, cfg.Logger
	if in.Workers != nil {
		acfg.Runner = in.Workers
	}
	in.Metrics.RateLimits(map[string]*limit.Limiter{"user": acfg.UserLimit, "ip": acfg.IPLimit})
	in.API = api.New(acfg)
	return nil
}

// Start runs the background work until Close: the local answers kept
// current across instances (internal/grab), the reaper, the dashboard's
// timeline, and the settlement worker when there is one.
func (in *Instance) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	in.stopBg = cancel
	in.bg.Go(func() { in.Grabs.Run(ctx) })
	in.bg.Go(func() { in.Reaper.Run(ctx) })
	in.bg.Go(func() { in.Timeline.Run(ctx) })
	if in.Settler != nil {
		in.bg.Go(func() { in.Settler.Run(ctx) })
	}
	in.bg.Go(func() { in.Shards.WatchClusters(ctx, in.clusterWatch, in.clusterChanged) })
}

// clusterChanged logs a change in a cluster shard's primaries and counts
// it (rain_shard_cluster_changes_total): a primary added or removed by the
// operator, or a replica promoted in a failover. Sub-pools follow their
// slots by themselves; the line says what happened.
func (in *Instance) clusterChanged(c shard.ClusterChange) {
	in.clusterChanges.Add(1)
	in.log.Warn("the primaries of a cluster shard changed", "shard", c.Shard,
		"added", c.Added, "removed", c.Removed, "primaries", c.Primaries)
}

// Close stops the instance; call it once the HTTP server has shut down (no
// request in flight). In order: the worker pool drains (its tasks finish,
// for up to drain), the background work stops (the reaper releases its
// lock), the claim lanes stop, the serial loader stops, the shard clients
// close. It returns the pool's error when its tasks did not finish in time.
// Calling it again does nothing.
func (in *Instance) Close(drain time.Duration) error {
	var err error
	in.closeOnce.Do(func() {
		if in.Workers != nil {
			err = in.Workers.Close(drain)
		}
		if in.stopBg != nil {
			in.stopBg()
			in.bg.Wait()
		}
		in.closeParts()
	})
	return err
}

// closeParts closes what New built, the last built first.
func (in *Instance) closeParts() {
	if in.Grabs != nil {
		in.Grabs.Close()
	}
	if in.Workers != nil {
		_ = in.Workers.Close(0) // a no-op once drained
	}
	if in.Serials != nil {
		in.Serials.Close()
	}
	_ = in.Shards.Close()
}
