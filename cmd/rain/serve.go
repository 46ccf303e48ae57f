package main

// This file is `rain serve`: build the instance from the flags, serve, and
// shut down in the order written in shutdown.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"time"

	"golang.org/x/sync/errgroup"

	"rain/internal/api"
	"rain/internal/auth"
	"rain/internal/instance"
	"rain/internal/limit"
	"rain/internal/lua"
	"rain/internal/pool"
	"rain/internal/shard"
)

// defaultDrainDelay is --drain-delay's default on real shards: a few of a
// load balancer's readiness probes.
const defaultDrainDelay = 5 * time.Second

// defaultGCPercent is the GC target of `rain serve` unless GOGC is set.
const defaultGCPercent = 400

// server is a running `rain serve`: the instance and what serves it.
type server struct {
	cfg   *serveConfig
	log   *slog.Logger
	in    *instance.Instance
	apart []func() // stop the side listeners (--admin-listen, --metrics-listen, --debug-listen)
	// warnings are what an operator must not miss, logged at start and
	// given to /readyz's admin answer.
	warnings []string
	release  []func() // what newServer set up beside the instance, undone last
	// unreached are the shards whose durability could not be read at
	// start: they did not answer (checkLater reads them once they do);
	// under strict they are held (no claim sent) until then.
	unreached []string
	held      *heldShards
}

func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, c := serveFlags(stderr)
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	log, err := c.Log.newLogger(stderr)
	if err != nil {
		return err
	}
	c.deprecated = f.deprecations()
	c.secretArgs = f.secretArgs([]string{"admin-token"}, "redis", "postgres")
	if c.Workers != "on" && c.Workers != "off" {
		return usagef("--workers %q: want on or off", c.Workers)
	}
	if getenv("GOGC") == "" {
		// The grab path allocates little that lives long; collecting less
		// often buys throughput (about 8% on 2 cores) for a few MB of heap.
		debug.SetGCPercent(defaultGCPercent)
	}
	s, err := newServer(ctx, c, log)
	if err != nil {
		return err
	}
	return s.run(ctx)
}

// newServer builds the instance from the flags and listens; on an error
// it undoes what it did.
func newServer(ctx context.Context, c *serveConfig, log *slog.Logger) (_ *server, err error) {
	s := &server{cfg: c, log: log}
	defer func() {
		if err != nil {
			s.undo()
		}
	}()
	specs, stopEmbedded, err := shardSpecs(c)
	if err != nil {
		return nil, asUsage(err)
	}
	s.release = append(s.release, stopEmbedded)
	icfg, err := s.instanceConfig(ctx, specs)
	if err != nil {
		return nil, err
	}
	if s.in, err = instance.New(icfg); err != nil {
		return nil, err
	}
	if err := s.listen(); err != nil {
		return nil, err
	}
	return s, nil
}

// instanceConfig is the instance the flags ask for: the shards (checked
// for durability), the admin and user tokens (reloaded on SIGHUP), the
// rate limits, the worker pool.
func (s *server) instanceConfig(ctx context.Context, specs []shard.Spec) (instance.Config, error) {
	c, log := s.cfg, s.log
	if !c.tryIt() {
		c.drainDelay = c.DrainDelay.or(defaultDrainDelay)
	} else {
		c.drainDelay = c.DrainDelay.or(0)
	}
	if err := s.checkTokens(); err != nil { // the first log line
		return instance.Config{}, err
	}
	for _, w := range append(c.deprecated, c.secretArgs...) {
		log.Warn(w)
	}
	admins, err := auth.NewAdmins(c.AdminToken, c.AdminTokenFile)
	if err != nil {
		return instance.Config{}, asUsage(err)
	}
	warnReadable(log, "--admin-token-file", c.AdminTokenFile)
	reloads := []reloader{{"admin tokens", admins.Reload}}
	acfg := api.Config{Admins: admins, AccessLog: c.AccessLog, ClientIPHeader: c.ClientIPHeader, MetricsOff: c.MetricsListen != "",
		AdminOff: c.AdminListen != "", MaxConns: c.MaxConns, IdleTimeout: c.IdleTimeout}
	userReloads, err := s.userAuth(&acfg)
	if err != nil {
		return instance.Config{}, err
	}
	reloads = append(reloads, userReloads...)
	if c.UserRate > 0 {
		acfg.UserLimit = limit.New(limit.Config{Rate: c.UserRate, Burst: c.UserBurst, MaxKeys: c.RateLimitKeys})
	}
	if c.IPRate > 0 {
		acfg.IPLimit = limit.New(limit.Config{Rate: c.IPRate, Burst: c.IPBurst, MaxKeys: c.RateLimitKeys})
	}
	s.release = append(s.release, reloadOnHUP(log, reloads...))
	tlsCfg, err := redisTLS(c.RedisCA)
	if err != nil {
		return instance.Config{}, err
	}
	if _, err := shard.SerialOf(specs, c.SerialShard); err != nil {
		return instance.Config{}, serialShardUsage(c.SerialShard)
	}
	icfg := instance.Config{Shards: specs, ShardOptions: shard.Options{Timeout: c.ShardTimeout, TLS: tlsCfg, Serial: c.SerialShard},
		API: acfg, Build: buildInfo(), Logger: log}
	var ok bool
	if icfg.Form.Outbox, ok = lua.ParseOutboxForm(c.Outbox); !ok {
		return instance.Config{}, usagef("--outbox %q: want fields, packed or batch", c.Outbox)
	}
	switch c.DeadlineIndex {
	case "grant":
	case "batch":
		icfg.Form.BatchedDeadlines = true
	default:
		return instance.Config{}, usagef("--deadline-index %q: want grant or batch", c.DeadlineIndex)
	}
	if !c.tryIt() {
		var relaxed bool
		if relaxed, s.unreached, err = checkSpecsDurability(ctx, specs, icfg.ShardOptions, c.Durability, log); err != nil {
			return instance.Config{}, err
		}
		s.held = newHeld(s.unreached, relaxed)
		icfg.Relaxed = s.held.isRelaxed
		if len(s.unreached) > 0 && c.Durability == "strict" {
			icfg.Held = s.held.has // no claim goes there until checkLater has read it
		}
	}
	if err := s.books(ctx, &icfg); err != nil {
		return instance.Config{}, err
	}
	if c.Workers == "on" {
		if c.WorkersMin < 1 || c.WorkersMin > c.WorkersMax {
			return instance.Config{}, usagef("--workers-min %d and --workers-max %d: want 1 ≤ min ≤ max", c.WorkersMin, c.WorkersMax)
		}
		icfg.Pool = &pool.Config{Min: c.WorkersMin, Max: c.WorkersMax, Queue: c.WorkersQueue}
	} else {
		log.Warn("worker pool off: grabs run on handler goroutines, unbounded (for comparison only)")
	}
	icfg.API.Warnings = s.warnings // all there are by now
	return icfg, nil
}

// embeddedWarning is the first log line of a run on embedded shards;
// warnEmbeddedExposed follows it when such a run listens beyond this host.
const (
	embeddedWarning     = "rain serve on 4 embedded in-memory shards (miniredis): for trying rain out, never for production; everything is lost on exit"
	warnEmbeddedExposed = "the try-it mode listens beyond this host (--listen): its admin token is in this log, and anyone who reaches it can preload and grab; listen on 127.0.0.1 unless that is what you want"
)

// alwaysHandler logs every record, whatever the level its handler was
// made with: for the lines a run must never hide.
type alwaysHandler struct{ slog.Handler }

func (alwaysHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h alwaysHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return alwaysHandler{h.Handler.WithAttrs(as)}
}

func (h alwaysHandler) WithGroup(name string) slog.Handler {
	return alwaysHandler{h.Handler.WithGroup(name)}
}

// checkTokens says what the run is (embedded, or real shards) and checks
// the admin token: generated for an embedded run without one, required and
// long enough with --redis.
func (s *server) checkTokens() error {
	c, log := s.cfg, s.log
	if c.tryIt() {
		// The contract (API.md): the try-it mode says so in its first log
		// line and prints its generated token, whatever --log-level says.
		always := slog.New(alwaysHandler{log.Handler()})
		always.Warn(embeddedWarning, versionAttrs()...)
		s.warnings = append(s.warnings, embeddedWarning)
		if host, _, err := net.SplitHostPort(c.Listen); err == nil && !loopbackHost(host) {
			s.warn(warnEmbeddedExposed)
		}
		if c.AdminToken == "" && c.AdminTokenFile == "" {
			c.AdminToken = newToken()
			always.Info("admin token for this run", "admin_token", c.AdminToken)
		}
		return nil
	}
	log.Info("rain serve", versionAttrs()...)
	if c.AdminToken == "" && c.AdminTokenFile == "" {
		return usagef("--admin-token (RAIN_ADMIN_TOKEN) or --admin-token-file is required with --redis")
	}
	if c.AdminToken != "" {
		if err := auth.CheckAdminToken(c.AdminToken); err != nil {
			return usagef("--admin-token (RAIN_ADMIN_TOKEN): %w", err)
		}
	}
	return nil
}

// listen opens the API's listener and the side listeners.
func (s *server) listen() error {
	if err := s.in.API.Listen(s.cfg.Listen); err != nil {
		return err
	}
	s.in.Metrics.Connections(s.in.API.Connections)
	return s.listenApart()
}

// run serves until ctx ends (SIGTERM) or serving fails, then shuts down.
func (s *server) run(ctx context.Context) error {
	s.in.Start()
	s.log.Info("serving", "addr", s.in.API.Addr().String(), "shards", len(s.in.Shards.Names()))
	g, gctx := errgroup.WithContext(ctx)
	g.Go(s.in.API.Serve)
	if len(s.unreached) > 0 {
		g.Go(func() error {
			return checkLater(gctx, s.in.Shards, s.unreached, s.cfg.Durability, time.Second, s.log, s.held)
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		return s.shutdown(ctx.Err() != nil)
	})
	err := g.Wait()
	if err == nil {
		s.log.Info("stopped")
	}
	return err
}

// shutdown stops rain serve, answering every request that reached it. The
// order, written once:
//
//  1. readiness says 503 and every answer closes its connection; requests
//     are served as usual for the drain delay (on SIGTERM), so load
//     balancers stop sending and keep-alive clients reconnect elsewhere;
//  2. grabs are answered 503 with Retry-After before any work, for a
//     moment, so that clients still coming are told to go elsewhere;
//  3. the listener closes, after taking what waits in its backlog; every
//     open connection is answered and closed after its answer, or once
//     idle a moment; every in-flight grab finishes (each is one atomic
//     script: none is left half done). Steps 2 and 3 are the API's
//     Shutdown, which says how long each moment is;
//  4. the side listeners close;
//  5. the instance closes: the worker pool drains, the background work
//     stops (the reaper releases its lock), the claim lanes, the serial
//     loader and the shard clients stop;
//  6. what serve set up beside it ends: SIGHUP reloads, the database, the
//     embedded run's ledger, embedded shards.
//
// Steps 3 to 5 share --shutdown-timeout.
func (s *server) shutdown(signalled bool) error {
	c := s.cfg
	s.in.API.Drain()
	if c.drainDelay > 0 && signalled {
		s.log.Info("draining: /readyz answers 503", "drain_delay", c.drainDelay)
		time.Sleep(c.drainDelay)
	}
	s.log.Info("shutting down", "timeout", c.ShutdownTimeout)
	deadline := time.Now().Add(c.ShutdownTimeout)
	sctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	errs := []error{s.in.API.Shutdown(sctx)}
	for _, stop := range s.apart {
		stop()
	}
	errs = append(errs, s.in.Close(time.Until(deadline)))
	for i := len(s.release) - 1; i >= 0; i-- {
		s.release[i]()
	}
	return errors.Join(errs...)
}

// undo releases what newServer set up when it fails midway.
func (s *server) undo() {
	if s.in != nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // nothing was served: close the listener at once
		_ = s.in.API.Shutdown(ctx)
	}
	for _, stop := range s.apart {
		stop()
	}
	if s.in != nil {
		_ = s.in.Close(0)
	}
	for i := len(s.release) - 1; i >= 0; i-- {
		s.release[i]()
	}
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
