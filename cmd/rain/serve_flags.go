package main

// This file is the flags of `rain serve`.

import (
	"fmt"
	"io"
	"time"

	"rain/internal/pool"
	"rain/internal/shard"
)

// serveConfig is everything `rain serve` takes.
type serveConfig struct {
	Listen          string
	Redis           string
	AdminToken      string
	SerialShard     string
	ShutdownTimeout time.Duration
	Log             *logOptions
	Workers         string // "on" or "off": the worker pool grabs run on
	WorkersMin      int
	WorkersMax      int
	WorkersQueue    int
	DebugListen     string // pprof; "" = off
	MetricsListen   string // /metrics apart from the API; "" = on the API's listener
	AdminListen     string // the operator API apart from the clients'; "" = on the API's listener
	ShardTimeout    time.Duration
	MaxConns        int
	IdleTimeout     time.Duration
	Durability      string        // "strict" or "relaxed"
	DrainDelay      autoDuration  // --drain-delay as given
	drainDelay      time.Duration // what it means with the other flags
	AccessLog       int
	RedisCA         string
	AdminTokenFile  string
	UserAuth        string
	UserAudience    string
	UserIssuer      string
	UserLeeway      time.Duration
	UserRefresh     time.Duration
	UserAllowHTTP   bool
	UserRate        float64
	UserBurst       int
	IPRate          float64
	IPBurst         int
	ClientIPHeader  string
	RateLimitKeys   int
	Postgres        string   // the system of record closes reconcile with; "" = none
	Outbox          string   // "fields", "packed" or "batch": the form of a grant's outbox entry (lua.ParseOutboxForm)
	DeadlineIndex   string   // "grant" or "batch": a deadline index member per grant, or per batch
	secretArgs      []string // warnings of secrets given on the command line
	deprecated      []string // warnings of old flag names given (flags.deprecations)
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
	f.StringVar(&c.Workers, "workers", "on", `"on" runs grabs on the worker pool that resizes with the load and sheds overload; "off" runs them on the handler goroutine (for comparison only)`)
	f.IntVar(&c.WorkersMin, "workers-min", pool.DefaultMin, "fewest workers grabs run on (more than a stalled shard can hold while its breaker trips)")
	f.IntVar(&c.WorkersMax, "workers-max", pool.DefaultMax, "most workers grabs run on")
	f.IntVar(&c.WorkersQueue, "workers-queue", pool.DefaultQueue, "grabs that may wait for a worker before more are shed with 503 overloaded (negative: none wait)")
	durabilityFlag(f, &c.Durability)
	f.DurationVar(&c.ShardTimeout, "shard-timeout", shard.DefaultTimeout, "budget of one call to a shard (reads, writes, waiting for a connection; dialing a quarter of it): a shard that takes longer is answered 503 and its breaker opens")
	f.IntVar(&c.MaxConns, "max-conns", 0, "most client connections open at once; past it the connection idle the longest is closed (0: the file descriptor limit less 256)")
	f.DurationVar(&c.IdleTimeout, "idle-timeout", 30*time.Second, "how long a keep-alive client connection may stay idle")
	f.Var(&c.DrainDelay, "drain-delay", "on SIGTERM, how long (a `duration`, or auto: 5s on --redis shards, 0 embedded) /readyz answers 503 before the listener closes, so load balancers stop sending first")
	f.IntVar(&c.AccessLog, "access-log", 20, "requests logged a second at most (one line each with its X-Request-Id; a sample under load); 0: none")
	redisCAFlag(f, &c.RedisCA)
	f.StringVar(&c.AdminTokenFile, "admin-token-file", "", "file of admin tokens, one a line (several for rotation; reloaded on SIGHUP), beside or instead of --admin-token")
	f.StringVar(&c.UserAuth, "user-auth", "", `check a signed user token (Authorization: Bearer <JWT>) on every grab: "hs256:FILE" (shared secret), "rs256:FILE", "es256:FILE" or "eddsa:FILE" (PEM public key), "jwks:FILE" (reloaded on SIGHUP), or "jwks-url:URL" (the login service's JWKS, https, refreshed every --user-auth-refresh and when a token names a new kid); "none": off (grabs name their user in the body, and any client can grab as anyone); empty: off too, warned of loudly with --redis (at start and in /readyz's warnings)`)
	f.DurationVar(&c.UserRefresh, "user-auth-refresh", 5*time.Minute, "how often a --user-auth jwks-url is fetched again")
	f.BoolVar(&c.UserAllowHTTP, "user-auth-allow-http", false, "let a --user-auth jwks-url be http:// (tests only: anyone on the path could serve their own key and sign tokens for any user)")
	f.StringVar(&c.UserAudience, "user-auth-audience", "", "the aud a user token must carry (empty: not checked, and warned of)")
	f.StringVar(&c.UserIssuer, "user-auth-issuer", "", "the iss a user token must carry (empty: not checked, and warned of)")
	f.DurationVar(&c.UserLeeway, "user-auth-leeway", 5*time.Second, "clock skew allowed on a user token's exp and nbf")
	f.Float64Var(&c.UserRate, "user-rate", 0, "grabs a second one user may make (a token bucket; 429 rate_limited over it); 0: no limit")
	f.IntVar(&c.UserBurst, "user-burst", 5, "grabs one user may make at once before --user-rate applies")
	f.Float64Var(&c.IPRate, "ip-rate", 0, "grabs a second one client address may make; 0: no limit")
	f.IntVar(&c.IPBurst, "ip-burst", 50, "grabs one client address may make at once before --ip-rate applies")
	f.StringVar(&c.ClientIPHeader, "client-ip-header", "", "header in which a trusted proxy in front of rain puts the client's address (X-Forwarded-For: its last entry; X-Real-IP); empty: the peer address. Only set it behind such a proxy: clients can send any header")
	f.IntVar(&c.RateLimitKeys, "rate-limit-keys", 100_000, "users (and client addresses) whose rate is remembered at most: memory stays bounded under a flood of distinct ids")
	f.StringVar(&c.DebugListen, "debug-listen", "", "serve Go's pprof profiles (/debug/pprof/, behind the admin token) on this address, apart from the API; empty: off")
	f.StringVar(&c.AdminListen, "admin-listen", "", "serve the operator endpoints and the dashboard (/admin/) on this address only, not on --listen (keep them off the clients' network); empty: on --listen")
	f.StringVar(&c.MetricsListen, "metrics-listen", "", "serve GET /metrics on this address only, not on --listen (keep stock and load figures off the clients' network); empty: on --listen")
	f.StringVar(&c.Postgres, "postgres", "", "the PostgreSQL database rain settle delivers into (postgres://...): a close reconciles the pool with it and records the account there; embedded, the in-process settle worker delivers into it; empty: none")
	f.StringVar(&c.Outbox, "outbox", "fields", `form of the grants' entries in the outbox settlement reads: "fields" (an entry per grant, a field per value, what every rain settle pays), "packed" (an entry per grant, one field: less Redis work per grant) or "batch" (one entry for a batch's grants: less still). Set packed only once every rain settle reading these shards is of a version that pays it (an older one acknowledges a packed grant without paying it), and batch only once every one is of this version or later (an older one acknowledges such an entry without paying it, or leaves it pending on itself until its grants are released at their deadline)`)
	f.bindEnv("outbox", "RAIN_OUTBOX")
	f.StringVar(&c.DeadlineIndex, "deadline-index", "grant", `how the reaper's deadline index names the grants a batch of claims makes: "grant" (a member each, what every rain serve reads) or "batch" (one member for the batch: less Redis work per grant). Set batch only once every rain serve on these shards is of this version or later: the reaper of an older one never releases grants named per batch`)
	f.bindEnv("deadline-index", "RAIN_DEADLINE_INDEX")
	f.bindEnv("listen", "RAIN_LISTEN")
	f.bindEnv("postgres", "RAIN_POSTGRES")
	f.bindEnv("redis", "RAIN_REDIS")
	f.bindEnv("admin-token", "RAIN_ADMIN_TOKEN")
	f.bindEnv("serial-shard", "RAIN_SERIAL_SHARD")
	f.bindEnv("shutdown-timeout", "RAIN_SHUTDOWN_TIMEOUT")
	f.bindEnv("workers", "RAIN_WORKERS")
	f.bindEnv("workers-min", "RAIN_WORKERS_MIN")
	f.bindEnv("workers-max", "RAIN_WORKERS_MAX")
	f.bindEnv("workers-queue", "RAIN_WORKERS_QUEUE")
	// The worker pool's flags were --pool... until --pool came to mean a
	// red-packet pool everywhere (rain preload --pool ID): the old names
	// work for one more release, with a warning.
	f.rename("pool", "RAIN_POOL", "workers")
	f.rename("pool-min", "RAIN_POOL_MIN", "workers-min")
	f.rename("pool-max", "RAIN_POOL_MAX", "workers-max")
	f.rename("pool-queue", "RAIN_POOL_QUEUE", "workers-queue")
	f.bindEnv("debug-listen", "RAIN_DEBUG_LISTEN")
	f.bindEnv("metrics-listen", "RAIN_METRICS_LISTEN")
	f.bindEnv("admin-listen", "RAIN_ADMIN_LISTEN")
	f.bindEnv("drain-delay", "RAIN_DRAIN_DELAY")
	f.bindEnv("admin-token-file", "RAIN_ADMIN_TOKEN_FILE")
	f.bindEnv("user-auth", "RAIN_USER_AUTH")
	f.bindEnv("user-auth-audience", "RAIN_USER_AUTH_AUDIENCE")
	f.bindEnv("user-auth-issuer", "RAIN_USER_AUTH_ISSUER")
	f.bindEnv("user-auth-leeway", "RAIN_USER_AUTH_LEEWAY")
	f.bindEnv("user-auth-refresh", "RAIN_USER_AUTH_REFRESH")
	f.bindEnv("user-auth-allow-http", "RAIN_USER_AUTH_ALLOW_HTTP")
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

// autoDuration is a duration flag whose default depends on other flags:
// "auto" until set.
type autoDuration struct {
	d   time.Duration
	set bool
}

func (a *autoDuration) String() string {
	if !a.set {
		return "auto"
	}
	return a.d.String()
}

func (a *autoDuration) Set(v string) error {
	if v == "auto" {
		*a = autoDuration{}
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("%s: want a duration of 0 or more", v)
	}
	a.d, a.set = d, true
	return nil
}

// or is the duration set, or def when none was.
func (a autoDuration) or(def time.Duration) time.Duration {
	if a.set {
		return a.d
	}
	return def
}
