package main

// This file is `rain serve`: its flags and the wiring of the service.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"rain/internal/api"
	"rain/internal/auth"
	"rain/internal/dash"
	"rain/internal/grab"
	"rain/internal/idgen"
	"rain/internal/limit"
	"rain/internal/lock"
	"rain/internal/metrics"
	"rain/internal/pool"
	"rain/internal/reaper"
	"rain/internal/shard"
	"runtime/debug"
	"time"

	"golang.org/x/sync/errgroup"
)

// reaperRetry is how long an instance waits between two tries at the
// reaper's lock (jittered to 0.5-1.5 times).
const reaperRetry = 4 * time.Second

// defaultDrainDelay is --drain-delay's default on real shards: a few of a
// load balancer's readiness probes.
const defaultDrainDelay = 5 * time.Second

// stopLinger is how long the listener stays open after grabs are answered
// 503 (Retry-After: 1) at shutdown: under the Retry-After, so a client
// told to come back later does not come back to a closing listener.
const stopLinger = 300 * time.Millisecond

// idleGrace is how long a connection must have been idle before shutdown
// closes it (see connGuard.drain).
const idleGrace = 500 * time.Millisecond

// maxHeaderBytes bounds a request's headers; more is answered 431 (JSON).
const maxHeaderBytes = 16 << 10

// defaultGCPercent is the GC target of `rain serve` unless GOGC is set.
const defaultGCPercent = 400

// serveConfig is everything `rain serve` takes.
type serveConfig struct {
	Listen          string
	Redis           string
	AdminToken      string
	SerialShard     string
	ShutdownTimeout time.Duration
	Log             *logOptions
	Pool            string // "on" or "off"
	PoolMin         int
	PoolMax         int
	PoolQueue       int
	DebugListen     string // pprof; "" = off
	MetricsListen   string // /metrics apart from the API; "" = on the API's listener
	ShardTimeout    time.Duration
	MaxConns        int
	IdleTimeout     time.Duration
	Durability      string // "strict" or "relaxed"
	DrainDelay      time.Duration
	AccessLog       int
	RedisCA         string
	AdminTokenFile  string
	UserAuth        string
	UserAudience    string
	UserIssuer      string
	UserLeeway      time.Duration
	UserRate        float64
	UserBurst       int
	IPRate          float64
	IPBurst         int
	ClientIPHeader  string
	RateLimitKeys   int
}

func serveFlags(stderr io.Writer) (*flags, *serveConfig) {
	c := &serveConfig{}
	f := newFlags("serve", stderr)
	f.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "address to serve HTTP on")
	f.StringVar(&c.Redis, "redis", "", "shards as name=weight@host:port, comma-separated; empty runs embedded in-memory shards (trying out only)")
	f.StringVar(&c.AdminToken, "admin-token", "", "bearer token of the operator endpoints (generated and printed when running embedded)")
	f.StringVar(&c.SerialShard, "serial-shard", "", "shard that holds the grant serial counter (default: the first in --redis); keep it when the shard list changes")
	f.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish on SIGTERM")
	c.Log = f.logFlags()
	f.StringVar(&c.Pool, "pool", "on", `"on" runs grabs on the worker pool that resizes with the load and sheds overload; "off" runs them on the handler goroutine (for comparison only)`)
	f.IntVar(&c.PoolMin, "pool-min", 32, "fewest workers of the grab pool (more than a stalled shard can hold while its breaker trips)")
	f.IntVar(&c.PoolMax, "pool-max", 1024, "most workers of the grab pool")
	f.IntVar(&c.PoolQueue, "pool-queue", 1024, "grabs that may wait for a worker before more are shed with 503 overloaded (negative: none wait)")
	durabilityFlag(f, &c.Durability)
	f.DurationVar(&c.ShardTimeout, "shard-timeout", shard.DefaultTimeout, "budget of one call to a shard (reads, writes, waiting for a connection; dialing a quarter of it): a shard that takes longer is answered 503 and its breaker opens")
	f.IntVar(&c.MaxConns, "max-conns", 0, "most client connections open at once; past it the connection idle the longest is closed (0: the file descriptor limit less 256)")
	f.DurationVar(&c.IdleTimeout, "idle-timeout", 30*time.Second, "how long a keep-alive client connection may stay idle")
	f.DurationVar(&c.DrainDelay, "drain-delay", -1, "on SIGTERM, how long /readyz answers 503 before the listener closes, so load balancers stop sending first (default 5s on --redis shards, 0 embedded)")
	f.IntVar(&c.AccessLog, "access-log", 20, "requests logged a second at most (one line each with its X-Request-Id; a sample under load); 0: none")
	redisCAFlag(f, &c.RedisCA)
	f.StringVar(&c.AdminTokenFile, "admin-token-file", "", "file of admin tokens, one a line (several for rotation; reloaded on SIGHUP), beside or instead of --admin-token")
	f.StringVar(&c.UserAuth, "user-auth", "", `check a signed user token (Authorization: Bearer <JWT>) on every grab: "hs256:FILE" (shared secret), "rs256:FILE" or "eddsa:FILE" (PEM public key), "jwks:FILE"; reloaded on SIGHUP; empty: off (grabs name their user in the body)`)
	f.StringVar(&c.UserAudience, "user-auth-audience", "", "the aud a user token must carry (empty: not checked)")
	f.StringVar(&c.UserIssuer, "user-auth-issuer", "", "the iss a user token must carry (empty: not checked)")
	f.DurationVar(&c.UserLeeway, "user-auth-leeway", 5*time.Second, "clock skew allowed on a user token's exp and nbf")
	f.Float64Var(&c.UserRate, "user-rate", 0, "grabs a second one user may make (a token bucket; 429 rate_limited over it); 0: no limit")
	f.IntVar(&c.UserBurst, "user-burst", 5, "grabs one user may make at once before --user-rate applies")
	f.Float64Var(&c.IPRate, "ip-rate", 0, "grabs a second one client address may make; 0: no limit")
	f.IntVar(&c.IPBurst, "ip-burst", 50, "grabs one client address may make at once before --ip-rate applies")
	f.StringVar(&c.ClientIPHeader, "client-ip-header", "", "header in which a trusted proxy in front of rain puts the client's address (X-Forwarded-For: its last entry; X-Real-IP); empty: the peer address. Only set it behind such a proxy: clients can send any header")
	f.IntVar(&c.RateLimitKeys, "rate-limit-keys", 100_000, "users (and client addresses) whose rate is remembered at most: memory stays bounded under a flood of distinct ids")
	f.StringVar(&c.DebugListen, "debug-listen", "", "serve Go's pprof profiles (/debug/pprof/) on this address, apart from the API; empty: off")
	f.StringVar(&c.MetricsListen, "metrics-listen", "", "serve GET /metrics on this address only, not on --listen (keep stock and load figures off the clients' network); empty: on --listen")
	f.bindEnv("listen", "RAIN_LISTEN")
	f.bindEnv("redis", "RAIN_REDIS")
	f.bindEnv("admin-token", "RAIN_ADMIN_TOKEN")
	f.bindEnv("serial-shard", "RAIN_SERIAL_SHARD")
	f.bindEnv("shutdown-timeout", "RAIN_SHUTDOWN_TIMEOUT")
	f.bindEnv("pool", "RAIN_POOL")
	f.bindEnv("pool-min", "RAIN_POOL_MIN")
	f.bindEnv("pool-max", "RAIN_POOL_MAX")
	f.bindEnv("pool-queue", "RAIN_POOL_QUEUE")
	f.bindEnv("debug-listen", "RAIN_DEBUG_LISTEN")
	f.bindEnv("metrics-listen", "RAIN_METRICS_LISTEN")
	f.bindEnv("drain-delay", "RAIN_DRAIN_DELAY")
	f.bindEnv("admin-token-file", "RAIN_ADMIN_TOKEN_FILE")
	f.bindEnv("user-auth", "RAIN_USER_AUTH")
	f.bindEnv("user-auth-audience", "RAIN_USER_AUTH_AUDIENCE")
	f.bindEnv("user-auth-issuer", "RAIN_USER_AUTH_ISSUER")
	f.bindEnv("user-auth-leeway", "RAIN_USER_AUTH_LEEWAY")
	f.bindEnv("user-rate", "RAIN_USER_RATE")
	f.bindEnv("user-burst", "RAIN_USER_BURST")
	f.bindEnv("ip-rate", "RAIN_IP_RATE")
	f.bindEnv("ip-burst", "RAIN_IP_BURST")
	f.bindEnv("client-ip-header", "RAIN_CLIENT_IP_HEADER")
	f.bindEnv("rate-limit-keys", "RAIN_RATE_LIMIT_KEYS")
	f.bindEnv("access-log", "RAIN_ACCESS_LOG")
	f.bindEnv("shard-timeout", "RAIN_SHARD_TIMEOUT")
	f.bindEnv("max-conns", "RAIN_MAX_CONNS")
	f.bindEnv("idle-timeout", "RAIN_IDLE_TIMEOUT")
	return f, c
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
	if c.Pool != "on" && c.Pool != "off" {
		return fmt.Errorf("--pool %q: want on or off", c.Pool)
	}
	if getenv("GOGC") == "" {
		// The grab path allocates little that lives long; collecting less
		// often buys throughput (about 8% on 2 cores) for a few MB of heap.
		debug.SetGCPercent(defaultGCPercent)
	}

	specs, stopEmbedded, err := shardSpecs(c.Redis)
	if err != nil {
		return err
	}
	defer stopEmbedded()
	if c.DrainDelay < 0 {
		c.DrainDelay = 0
		if c.Redis != "" {
			c.DrainDelay = defaultDrainDelay
		}
	}
	if c.Redis == "" {
		log.Warn("rain serve on 4 embedded in-memory shards (miniredis): for trying rain out, never for production; everything is lost on exit", versionAttrs()...)
		if c.AdminToken == "" && c.AdminTokenFile == "" {
			c.AdminToken = newToken()
			log.Info("admin token for this run", "admin_token", c.AdminToken)
		}
	} else {
		log.Info("rain serve", versionAttrs()...)
		if c.AdminToken == "" && c.AdminTokenFile == "" {
			return errors.New("--admin-token (RAIN_ADMIN_TOKEN) or --admin-token-file is required with --redis")
		}
		if c.AdminToken != "" && len(c.AdminToken) < auth.MinAdminToken {
			return fmt.Errorf("--admin-token (RAIN_ADMIN_TOKEN) is %d bytes; want at least %d with --redis (e.g. openssl rand -hex 16)", len(c.AdminToken), auth.MinAdminToken)
		}
		if c.UserAuth == "" {
			log.Warn("user auth is off: any client can grab as any user_id; give --user-auth to check the app's signed user tokens")
		}
	}
	admins, err := auth.NewAdmins(c.AdminToken, c.AdminTokenFile)
	if err != nil {
		return err
	}
	reloads := []reloader{{"admin tokens", admins.Reload}}
	var users *auth.Users
	if c.UserAuth != "" {
		if users, err = auth.NewUsers(auth.UserConfig{Spec: c.UserAuth, Audience: c.UserAudience, Issuer: c.UserIssuer, Leeway: c.UserLeeway}); err != nil {
			return fmt.Errorf("--user-auth: %w", err)
		}
		reloads = append(reloads, reloader{"user auth keys", users.Reload})
	}
	defer reloadOnHUP(log, reloads...)()
	tlsCfg, err := redisTLS(c.RedisCA)
	if err != nil {
		return err
	}

	set, err := shard.Open(specs, 0, shard.Options{Timeout: c.ShardTimeout, TLS: tlsCfg})
	if err != nil {
		return err
	}
	defer set.Close()
	reg := metrics.New(buildInfo())
	relaxed := false
	if c.Redis != "" {
		if relaxed, err = checkDurability(ctx, set, c.Durability, log); err != nil {
			return err
		}
	}
	reg.Durability(relaxed)
	serialShard := c.SerialShard
	if serialShard == "" {
		serialShard = specs[0].Name
	}
	if set.Client(serialShard) == nil {
		return fmt.Errorf("--serial-shard %q is not one of the shards", serialShard)
	}
	// Serials come from the serial shard, with watermark copies on the others.
	gen, err := idgen.New(idgen.NewRedisAllocator(set.Client(serialShard), idgen.Key, set.Except(serialShard)...), idgen.Config{})
	if err != nil {
		return err
	}
	defer gen.Close()

	var workers *pool.Pool
	reg.Serials(gen.Stats)
	gcfg := grab.Config{Serials: gen, Arbiter: serialShard, Logger: log, OnBatch: reg.Batches(set.Names())}
	if c.Pool == "on" {
		workers, err = pool.New(pool.Config{Min: c.PoolMin, Max: c.PoolMax, Queue: c.PoolQueue, Logger: log})
		if err != nil {
			return err
		}
		defer workers.Close(c.ShutdownTimeout) // no-op after the drain below
		gcfg.Places = workers.Places           // each shard's bulkhead: its share of the places
	} else {
		log.Warn("worker pool off: grabs run on handler goroutines, unbounded (for comparison only)")
	}
	svc := grab.New(set, gcfg)
	defer svc.Close()
	reg.Shards(svc.ShardStats, set)
	reg.Stock(svc.Stock)
	timeline := dash.NewTimeline(reg.Gatherer())
	cfg := api.Config{Grabber: svc, Pools: svc, AdminToken: c.AdminToken, Ready: svc.Ready, Logger: log, Metrics: reg,
		AccessLog: c.AccessLog, Timeline: timeline, Admins: admins, ClientIPHeader: c.ClientIPHeader,
		MetricsOff: c.MetricsListen != ""}
	if users != nil {
		cfg.Users = users
	}
	if c.UserRate > 0 {
		cfg.UserLimit = limit.New(limit.Config{Rate: c.UserRate, Burst: c.UserBurst, MaxKeys: c.RateLimitKeys})
	}
	if c.IPRate > 0 {
		cfg.IPLimit = limit.New(limit.Config{Rate: c.IPRate, Burst: c.IPBurst, MaxKeys: c.RateLimitKeys})
	}
	reg.RateLimits(map[string]*limit.Limiter{"user": cfg.UserLimit, "ip": cfg.IPLimit})
	if workers != nil {
		cfg.Runner = workers
		reg.Pool(workers.Stats)
	}
	// The reaper competes for its lock in every instance; one sweeps.
	// An instance waiting for the lock tries every few seconds, not every
	// 200 ms: a crashed leader is taken over within TTL + reaperRetry, and
	// the waiting costs each shard one attempt per instance every few seconds.
	reap := reaper.New(svc, lock.New(set.Clients(), lock.Config{Logger: log, RetryDelay: reaperRetry}), reaper.Config{Logger: log})
	reg.Reaper(reap.Stats)

	tcp, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return err
	}
	ln := &stoppable{TCPListener: tcp.(*net.TCPListener)}
	defer ln.Close() // closed by Stop or Serve too; this covers a return before them
	if c.MaxConns <= 0 {
		c.MaxConns = defaultMaxConns()
	}
	conns := newConnGuard(c.MaxConns)
	reg.Connections(conns.stats)
	handler := api.New(cfg)
	srv := &http.Server{
		Handler:           handler,
		MaxHeaderBytes:    maxHeaderBytes,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       c.IdleTimeout,
		ConnState:         conns.state,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("serving", "addr", ln.Addr().String(), "shards", len(specs), "serial_shard", serialShard)

	if c.DebugListen != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		stop, err := serveApart("debug-listen", c.DebugListen, mux, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if c.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", reg.Handler())
		stop, err := serveApart("metrics-listen", c.MetricsListen, mux, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	// Background work: local answers (unknown and sold-out pools) kept
	// current across instances, and the reaper. It stops after the HTTP
	// server and the worker pool have drained, before the deferred closes.
	bgCtx, stopBackground := context.WithCancel(context.Background())
	var background errgroup.Group
	background.Go(func() error { svc.Run(bgCtx); return nil })
	background.Go(func() error { reap.Run(bgCtx); return nil })
	background.Go(func() error { timeline.Run(bgCtx); return nil })
	defer func() { stopBackground(); _ = background.Wait() }()

	// The server runs until it fails or ctx ends; then the shutdown below.
	// Order: readiness says 503 and every answer closes its connection;
	// after the drain delay, grabs are answered 503 with Retry-After before
	// any work, for stopLinger, so that clients still coming are told to go
	// elsewhere; then the listener closes (what waits in its backlog is
	// taken first); every request that reached rain is answered, and a
	// connection is closed once answered, or once idle for idleGrace (never
	// the moment it turns idle, which would race a request on the wire);
	// in-flight grabs finish (each is one atomic script: none is left half
	// done); the worker pool drains; then the deferred calls stop the
	// background work (the reaper releases its lock), the claim batchers,
	// the serial loader and the shard clients.
	g, gctx := errgroup.WithContext(ctx)
	served := make(chan struct{})
	g.Go(func() error {
		defer close(served)
		err := srv.Serve(jsonErrors{ln})
		if errors.Is(err, http.ErrServerClosed) || ln.stopping.Load() && errors.Is(err, net.ErrClosed) {
			return nil
		}
		return fmt.Errorf("serve: %w", err)
	})
	g.Go(func() error {
		<-gctx.Done()
		handler.Drain()
		if c.DrainDelay > 0 && ctx.Err() != nil {
			log.Info("draining: /readyz answers 503", "drain_delay", c.DrainDelay)
			time.Sleep(c.DrainDelay)
		}
		log.Info("shutting down", "timeout", c.ShutdownTimeout)
		deadline := time.Now().Add(c.ShutdownTimeout)
		handler.Stop()
		time.Sleep(min(stopLinger, c.ShutdownTimeout))
		ln.Stop()
		select {
		case <-served: // the backlog taken, the listener closed
		case <-time.After(time.Until(deadline)):
		}
		if !conns.drain(deadline, idleGrace) {
			log.Warn("connections still open at the shutdown timeout", "open", conns.openNow())
		}
		sctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
		if workers != nil {
			return workers.Close(time.Until(deadline))
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	log.Info("stopped")
	return nil
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// serveApart serves h on addr (the value of --flag), on a listener of its
// own so that it is never exposed with the API; stop shuts it down.
func serveApart(flag, addr string, h http.Handler, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	log.Info("listening apart", "flag", flag, "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
