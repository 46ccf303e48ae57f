package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"rain/internal/api"
	"rain/internal/grab"
	"rain/internal/idgen"
	"rain/internal/lock"
	"rain/internal/metrics"
	"rain/internal/pool"
	"rain/internal/reaper"
	"rain/internal/settle"
	"rain/internal/shard"
)

const usage = `usage: rain <command> [flags]

commands:
  serve     run the service (POST /grab and the operator API)
  preload   load a pool of red packets
  audit     check a pool's conservation; exits non-zero on a problem
  settle    confirm grants and hand them to the wallet side (ledger file or webhook)

Every flag can also be set by the environment variable named in its help.
Run "rain <command> -h" for a command's flags.`

// run is main without the process: it returns an error instead of exiting.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return errors.New("no command given")
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], getenv, stderr)
	case "preload":
		err = preload(ctx, args[1:], getenv, stdout, stderr)
	case "audit":
		err = audit(ctx, args[1:], getenv, stdout, stderr)
	case "settle":
		err = settleCmd(ctx, args[1:], getenv, stderr)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	default:
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h printed the flags
	}
	return err
}

// flags is a FlagSet whose flags also read an environment variable.
type flags struct {
	*flag.FlagSet
	env map[string]string // flag name -> env var
}

func newFlags(name string, stderr io.Writer) *flags {
	fs := flag.NewFlagSet("rain "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &flags{FlagSet: fs, env: map[string]string{}}
}

// bindEnv notes that flag name also reads env var; help says so.
func (f *flags) bindEnv(name, env string) {
	f.env[name] = env
	fl := f.Lookup(name)
	fl.Usage += " [" + env + "]"
}

// parse sets flags from the environment, then from args, which win.
func (f *flags) parse(args []string, getenv func(string) string) error {
	for name, env := range f.env {
		if v := getenv(env); v != "" {
			if err := f.Set(name, v); err != nil {
				return fmt.Errorf("%s=%q: %w", env, v, err)
			}
		}
	}
	if err := f.Parse(args); err != nil {
		return err
	}
	if f.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", f.Args())
	}
	return nil
}

// defaultGCPercent is the GC target of `rain serve` unless GOGC is set.
const defaultGCPercent = 400

// serveConfig is everything `rain serve` takes.
type serveConfig struct {
	Listen          string
	Redis           string
	AdminToken      string
	SerialShard     string
	ShutdownTimeout time.Duration
	LogLevel        string
	Pool            string // "on" or "off"
	PoolMin         int
	PoolMax         int
	PoolQueue       int
	Durability      string // "strict" or "relaxed"
}

func serveFlags(stderr io.Writer) (*flags, *serveConfig) {
	c := &serveConfig{}
	f := newFlags("serve", stderr)
	f.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "address to serve HTTP on")
	f.StringVar(&c.Redis, "redis", "", "shards as name=weight@host:port, comma-separated; empty runs embedded in-memory shards (trying out only)")
	f.StringVar(&c.AdminToken, "admin-token", "", "bearer token of the operator endpoints (generated and printed when running embedded)")
	f.StringVar(&c.SerialShard, "serial-shard", "", "shard that holds the grant serial counter (default: the first in --redis); keep it when the shard list changes")
	f.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may take to finish on SIGTERM")
	f.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&c.Pool, "pool", "on", `"on" runs grabs on the worker pool that resizes with the load and sheds overload; "off" runs them on the handler goroutine (for comparison only)`)
	f.IntVar(&c.PoolMin, "pool-min", 8, "fewest workers of the grab pool")
	f.IntVar(&c.PoolMax, "pool-max", 1024, "most workers of the grab pool")
	f.IntVar(&c.PoolQueue, "pool-queue", 1024, "grabs that may wait for a worker before more are shed with 503 overloaded (negative: none wait)")
	durabilityFlag(f, &c.Durability)
	f.bindEnv("listen", "RAIN_LISTEN")
	f.bindEnv("redis", "RAIN_REDIS")
	f.bindEnv("admin-token", "RAIN_ADMIN_TOKEN")
	f.bindEnv("serial-shard", "RAIN_SERIAL_SHARD")
	f.bindEnv("shutdown-timeout", "RAIN_SHUTDOWN_TIMEOUT")
	f.bindEnv("log-level", "RAIN_LOG_LEVEL")
	f.bindEnv("pool", "RAIN_POOL")
	f.bindEnv("pool-min", "RAIN_POOL_MIN")
	f.bindEnv("pool-max", "RAIN_POOL_MAX")
	f.bindEnv("pool-queue", "RAIN_POOL_QUEUE")
	return f, c
}

func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, c := serveFlags(stderr)
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	log, err := newLogger(c.LogLevel, stderr)
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
	if c.Redis == "" {
		log.Warn("running on 4 embedded in-memory shards (miniredis): for trying rain out, never for production; everything is lost on exit")
		if c.AdminToken == "" {
			c.AdminToken = newToken()
		}
		log.Info("admin token for this run", "admin_token", c.AdminToken)
	} else if c.AdminToken == "" {
		return errors.New("--admin-token (RAIN_ADMIN_TOKEN) is required with --redis")
	}

	set, err := shard.Open(specs, 0, shard.Options{})
	if err != nil {
		return err
	}
	defer set.Close()
	durable := metrics.Metric{Name: "rain_durability_relaxed", Kind: "gauge",
		Help: "1 when rain runs with --durability relaxed on shards that can lose acknowledged grants."}
	if c.Redis != "" {
		relaxed, err := checkDurability(ctx, set, c.Durability, log)
		if err != nil {
			return err
		}
		durable.V = boolMetric(relaxed)
	}
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

	svc := grab.New(set, grab.Config{Serials: gen, Arbiter: serialShard, Logger: log})
	defer svc.Close()
	// Local answers (unknown pools, sold-out pools) kept current across
	// instances; stopped after the reaper, before the closes.
	localCtx, stopLocal := context.WithCancel(context.Background())
	local := make(chan struct{})
	go func() { defer close(local); svc.Run(localCtx) }()
	defer func() { stopLocal(); <-local }()
	cfg := api.Config{Grabber: svc, Pools: svc, AdminToken: c.AdminToken, Ready: set.Ping, Logger: log,
		Metrics: []func([]byte) []byte{serialMetrics(gen), func(b []byte) []byte { return metrics.Append(b, durable) }}}
	var workers *pool.Pool
	if c.Pool == "on" {
		workers, err = pool.New(pool.Config{Min: c.PoolMin, Max: c.PoolMax, Queue: c.PoolQueue, Logger: log})
		if err != nil {
			return err
		}
		defer workers.Close(c.ShutdownTimeout) // no-op after the drain below
		cfg.Runner = workers
		cfg.Metrics = append(cfg.Metrics, workers.AppendMetrics)
	} else {
		log.Warn("worker pool off: grabs run on handler goroutines, unbounded (for comparison only)")
	}
	// The reaper competes for its lock in every instance; one sweeps.
	var clients []*redis.Client
	for _, name := range set.Names() {
		clients = append(clients, set.Client(name))
	}
	reap := reaper.New(svc, lock.New(clients, lock.Config{Logger: log}), reaper.Config{Logger: log})
	cfg.Metrics = append(cfg.Metrics, reap.AppendMetrics)
	reapCtx, stopReaping := context.WithCancel(context.Background())
	reaped := make(chan struct{})
	go func() { defer close(reaped); reap.Run(reapCtx) }()
	defer func() { stopReaping(); <-reaped }() // before the closes deferred above

	handler := api.New(cfg)
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("serving", "addr", ln.Addr().String(), "shards", len(specs), "serial_shard", serialShard)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Shutdown order: stop taking requests and let in-flight grabs finish
	// (each is one atomic script: none is left half done), drain the worker
	// pool, then the deferred calls stop the reaper (releasing its lock), the
	// claim batchers, the serial loader and the shard clients.
	log.Info("shutting down", "timeout", c.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), c.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if workers != nil {
		if err := workers.Close(c.ShutdownTimeout); err != nil {
			return err
		}
	}
	log.Info("stopped")
	return nil
}

// durabilityFlag binds --durability [RAIN_DURABILITY].
func durabilityFlag(f *flags, v *string) {
	f.StringVar(v, "durability", "strict", `"strict" refuses to start on shards that can lose an acknowledged grant on a host crash (AOF off, or appendfsync other than always); "relaxed" starts anyway, with a warning`)
	f.bindEnv("durability", "RAIN_DURABILITY")
}

// checkDurability reads every shard's persistence settings. Under strict it
// refuses shards that could lose an acknowledged grant; under relaxed it
// warns and reports relaxed = true when some shard is not durable. A shard
// whose settings cannot be read (CONFIG not allowed) is warned about, never
// refused.
func checkDurability(ctx context.Context, set *shard.Set, mode string, log *slog.Logger) (relaxed bool, err error) {
	if mode != "strict" && mode != "relaxed" {
		return false, fmt.Errorf("--durability %q: want strict or relaxed", mode)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var weak []string
	for _, d := range set.Durability(cctx) {
		switch {
		case d.Err != nil:
			log.Warn("shard durability unknown; make sure it runs appendonly yes, appendfsync always", "shard", d.Shard, "err", d.Err)
		case !d.Durable():
			weak = append(weak, d.String())
		}
	}
	if len(weak) == 0 {
		return false, nil
	}
	if mode == "strict" {
		return false, fmt.Errorf("refusing to start: %s (or run with --durability relaxed, accepting that a host crash can lose or repeat money)", strings.Join(weak, "; "))
	}
	for _, w := range weak {
		log.Warn("durability relaxed: "+w, "durability", mode)
	}
	return true, nil
}

// shardSpecs parses --redis, or starts 4 embedded in-memory shards when it
// is empty. stop closes what was started.
func shardSpecs(redis string) (specs []shard.Spec, stop func(), err error) {
	if redis != "" {
		specs, err = shard.ParseSpecs(redis)
		return specs, func() {}, err
	}
	var mrs []*miniredis.Miniredis
	stop = func() {
		for _, m := range mrs {
			m.Close()
		}
	}
	for i := range 4 {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			stop()
			return nil, nil, fmt.Errorf("embedded shard: %w", err)
		}
		mrs = append(mrs, m)
		specs = append(specs, shard.Spec{Name: fmt.Sprintf("mem%d", i+1), Weight: 1, Addr: m.Addr()})
	}
	return specs, stop, nil
}

// newLogger is the one logger of a command, at level (--log-level).
func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// serialMetrics appends the grant serial generator's figures.
func serialMetrics(gen *idgen.Generator) func([]byte) []byte {
	return func(b []byte) []byte {
		st := gen.Stats()
		return metrics.Append(b,
			metrics.Metric{Name: "rain_serial_step", Kind: "gauge", Help: "IDs the next serial segment will reserve.", V: st.Step},
			metrics.Metric{Name: "rain_serial_loads_total", Kind: "counter", Help: "Serial segments loaded.", V: st.Loads},
			metrics.Metric{Name: "rain_serial_load_errors_total", Kind: "counter", Help: "Failed serial segment loads.", V: st.LoadErrors},
			metrics.Metric{Name: "rain_serial_stalls_total", Kind: "counter", Help: "Times a grab waited for a serial segment.", V: st.Stalls},
			metrics.Metric{Name: "rain_serial_refusals_total", Kind: "counter", Help: "Serial segments refused for going backwards.", V: st.Refusals},
		)
	}
}

func boolMetric(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// toolConfig is what every operator tool takes.
type toolConfig struct {
	Redis       string
	SerialShard string
}

// toolFlags are the flags shared by the operator tools.
func toolFlags(name string, stderr io.Writer) (*flags, *toolConfig) {
	f := newFlags(name, stderr)
	c := &toolConfig{}
	f.StringVar(&c.Redis, "redis", "", "shards as name=weight@host:port, comma-separated (required)")
	f.StringVar(&c.SerialShard, "serial-shard", "", "the serial shard of rain serve, which arbitrates pool records (default: the first in --redis)")
	f.bindEnv("redis", "RAIN_REDIS")
	f.bindEnv("serial-shard", "RAIN_SERIAL_SHARD")
	return f, c
}

// openTool opens the shards of --redis and a service that preloads, reports
// and audits; serialShard is the pool records' arbiter ("" = the first).
func openTool(redis, serialShard string) (*shard.Set, *grab.Service, error) {
	if redis == "" {
		return nil, nil, errors.New("--redis (RAIN_REDIS) is required")
	}
	specs, err := shard.ParseSpecs(redis)
	if err != nil {
		return nil, nil, err
	}
	if serialShard == "" {
		serialShard = specs[0].Name
	}
	set, err := shard.Open(specs, 0, shard.Options{})
	if err != nil {
		return nil, nil, err
	}
	if set.Client(serialShard) == nil {
		set.Close()
		return nil, nil, fmt.Errorf("--serial-shard %q is not one of the shards", serialShard)
	}
	// The tools grant nothing, so they need no serials.
	return set, grab.New(set, grab.Config{Arbiter: serialShard}), nil
}

func preload(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f, tc := toolFlags("preload", stderr)
	var spec grab.Spec
	var startsAt, endsAt string
	f.StringVar(&spec.PoolID, "pool", "", "pool id (required)")
	f.Int64Var(&spec.TotalCents, "total-cents", 0, "total of the pool in cents (required)")
	f.Int64Var(&spec.Count, "count", 0, "number of packets (required)")
	f.Int64Var(&spec.MinCents, "min-cents", 0, "smallest packet in cents (0 = 1)")
	f.Int64Var(&spec.MaxCents, "max-cents", 0, "largest packet in cents (0 = no maximum)")
	f.IntVar(&spec.SubPools, "sub-pools", 0, "number of sub-pools (0 = chosen by rain)")
	f.StringVar(&startsAt, "starts-at", "", "RFC 3339 start time (empty = open at once)")
	f.StringVar(&endsAt, "ends-at", "", "RFC 3339 end time (empty = no end)")
	f.Int64Var(&spec.HoldSeconds, "hold-seconds", 0, "how long a grant waits for confirmation (0 = 600)")
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	for _, t := range []struct {
		flag string
		in   string
		out  **time.Time
	}{{"--starts-at", startsAt, &spec.StartsAt}, {"--ends-at", endsAt, &spec.EndsAt}} {
		if t.in == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.in)
		if err != nil {
			return fmt.Errorf("%s: %w", t.flag, err)
		}
		*t.out = &v
	}
	set, svc, err := openTool(tc.Redis, tc.SerialShard)
	if err != nil {
		return err
	}
	defer set.Close()
	defer svc.Close()
	st, created, err := svc.Preload(ctx, spec)
	if err != nil {
		return err
	}
	if !created {
		fmt.Fprintf(stderr, "pool %s was already loaded with this spec\n", spec.PoolID)
	}
	return printJSON(stdout, st)
}

func audit(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	f, tc := toolFlags("audit", stderr)
	pool := f.String("pool", "", "pool id (required)")
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	if !grab.ValidID(*pool) {
		return fmt.Errorf("--pool %q: must be 1-64 characters from A-Z a-z 0-9 _ - . :", *pool)
	}
	set, svc, err := openTool(tc.Redis, tc.SerialShard)
	if err != nil {
		return err
	}
	defer set.Close()
	defer svc.Close()
	rep, err := svc.Audit(ctx, *pool)
	if err != nil {
		return err
	}
	if err := printJSON(stdout, rep); err != nil {
		return err
	}
	if !rep.OK {
		problems := make([]string, len(rep.Problems))
		for i, p := range rep.Problems {
			problems[i] = p.String()
		}
		return fmt.Errorf("audit of %s found %d problems: %s", *pool, len(rep.Problems), strings.Join(problems, "; "))
	}
	return nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func settleCmd(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	f, tc := toolFlags("settle", stderr)
	var cfg settle.Config
	var ledger, webhook, logLevel string
	f.StringVar(&ledger, "ledger", "", "append settled grants to this JSON-lines file (one line per serial, fsynced)")
	f.StringVar(&webhook, "webhook", "", "POST settled grants to this wallet URL (Idempotency-Key: serial)")
	f.StringVar(&cfg.Group, "group", "settle", "consumer group on the outbox streams")
	f.StringVar(&cfg.Consumer, "consumer", "", "this worker's consumer name, unique per process (default hostname-pid)")
	f.DurationVar(&cfg.ClaimAfter, "claim-after", 30*time.Second, "take over entries pending this long on a dead consumer")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	var durability string
	durabilityFlag(f, &durability)
	var listen string
	f.StringVar(&listen, "listen", "", "serve GET /healthz and GET /metrics on this address (empty: none)")
	f.bindEnv("listen", "RAIN_SETTLE_LISTEN")
	f.bindEnv("ledger", "RAIN_LEDGER")
	f.bindEnv("webhook", "RAIN_WEBHOOK")
	f.bindEnv("group", "RAIN_SETTLE_GROUP")
	f.bindEnv("consumer", "RAIN_SETTLE_CONSUMER")
	f.bindEnv("claim-after", "RAIN_CLAIM_AFTER")
	f.bindEnv("log-level", "RAIN_LOG_LEVEL")
	if err := f.parse(args, getenv); err != nil {
		return err
	}
	log, err := newLogger(logLevel, stderr)
	if err != nil {
		return err
	}
	cfg.Logger = log
	var sink settle.Sink
	switch {
	case (ledger == "") == (webhook == ""):
		return errors.New("give exactly one of --ledger and --webhook")
	case ledger != "":
		l, err := settle.OpenLedger(ledger)
		if err != nil {
			return err
		}
		defer l.Close()
		sink = l
	default:
		if u, err := url.Parse(webhook); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("--webhook %q: want an http(s) URL", webhook)
		}
		sink = &settle.Webhook{URL: webhook}
	}
	set, svc, err := openTool(tc.Redis, tc.SerialShard)
	if err != nil {
		return err
	}
	defer set.Close()
	defer svc.Close()
	// A confirm must be on disk before the payout: settle refuses shards
	// that could lose it, as serve does.
	relaxed, err := checkDurability(ctx, set, durability, log)
	if err != nil {
		return err
	}
	cfg.Logger.Info("settling", "shards", len(set.Names()), "group", cfg.Group, "ledger", ledger, "webhook", webhook)
	w := settle.New(set, svc, sink, cfg)
	if listen != "" {
		stop, err := serveHealth(listen, func(b []byte) []byte {
			st := w.Stats()
			return metrics.Append(b,
				metrics.Metric{Name: "rain_settle_delivered_total", Kind: "counter", Help: "Grants confirmed and delivered to the sink.", V: st.Delivered},
				metrics.Metric{Name: "rain_settle_expired_total", Kind: "counter", Help: "Outbox grants already released at their deadline: not paid.", V: st.Expired},
				metrics.Metric{Name: "rain_settle_anomalies_total", Kind: "counter", Help: "Outbox entries with no matching grant.", V: st.Anomalies},
				metrics.Metric{Name: "rain_settle_failures_total", Kind: "counter", Help: "Failed deliveries (retried).", V: st.Failures},
				metrics.Metric{Name: "rain_settle_conflicts_total", Kind: "counter", Help: "Outbox entries whose serial the sink had paid for another grant: left pending for an operator.", V: st.Conflicts},
				metrics.Metric{Name: "rain_durability_relaxed", Kind: "gauge", Help: "1 when rain runs with --durability relaxed on shards that can lose acknowledged grants.", V: boolMetric(relaxed)},
			)
		})
		if err != nil {
			return err
		}
		defer stop()
	}
	return w.Run(ctx)
}

// serveHealth serves GET /healthz and GET /metrics on addr in the
// background; stop shuts it down.
func serveHealth(addr string, appendMetrics func([]byte) []byte) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(appendMetrics(nil))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	}, nil
}
