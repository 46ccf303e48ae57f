// Package api is rain's HTTP layer: the contract of docs/api.md, and the one
// place where domain results and errors become status codes.
package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"rain"
	"rain/docs"
	"rain/internal/dash"
	"rain/internal/grab"
	"rain/internal/limit"
	"rain/internal/metrics"
	"rain/internal/pool"
)

// MaxGrabBody is the largest POST /grab body accepted.
const MaxGrabBody = 4 << 10

// Grabber is what the grab endpoint needs.
type Grabber interface {
	Grab(ctx context.Context, poolID, userID string) (grab.Result, error)
}

// beginner is a Grabber whose grabs come in two parts (grab.Service is
// one): Begin, which queues the grab's claim at its shard, runs on a worker;
// the request then waits for the shard's answer off the worker pool, so a
// shard that stalls holds none of the workers the other shards' grabs need.
type beginner interface {
	Begin(ctx context.Context, poolID, userID string) grab.Pending
}

// Pools is what the operator endpoints need.
type Pools interface {
	Preload(ctx context.Context, spec rain.Spec) (*rain.Status, bool, error)
	Status(ctx context.Context, id string) (*rain.Status, error)
	Audit(ctx context.Context, id string) (*rain.Report, error)
	Confirm(ctx context.Context, poolID, userID string, serial int64) error
	ReadList(ctx context.Context) ([]string, error)
	End(ctx context.Context, id string) (*rain.Status, error)
	Close(ctx context.Context, id string) (*rain.Account, error)
}

// Runner runs grabs as tasks (internal/pool's Pool). Admit takes a place
// for a grab once its body is read (a body held back never holds a place),
// or reports false (shed: 503 at once); an admitted request may RunTask its
// task, which waits for the task and returns pool.ErrPanicked when it
// panicked, or ctx's error when the client has gone; it Leaves once
// answered, whatever the answer.
type Runner interface {
	Admit() bool
	Leave()
	RunTask(ctx context.Context, t pool.Task) error
}

// Config wires a Server. Grabber, Pools, Admins and Ready are required.
type Config struct {
	Grabber Grabber
	Pools   Pools
	// Ready reports each shard's state and whether every shard is up
	// (GET /readyz, answered within a second whatever the shards do).
	Ready func(ctx context.Context) grab.Readiness
	// Runner runs every grab; nil runs grabs on the handler goroutine
	// (rain serve --workers=off, for comparison only).
	Runner Runner
	// Metrics is the process's registry: the server adds the grab series
	// to it and serves it on GET /metrics. Nil: a registry of its own.
	Metrics *metrics.Registry
	// MetricsOff leaves GET /metrics out of this handler (rain serve
	// --metrics-listen serves the registry on a listener of its own).
	MetricsOff bool
	// AdminOff leaves the operator endpoints and the dashboard out of this
	// handler (rain serve --admin-listen serves Server.Admin on a listener
	// of its own).
	AdminOff bool
	// Users, when set, checks the user token of every grab (user auth on):
	// its subject is the user. Nil: grabs name their user in the body.
	Users interface {
		Subject(authorization string) (string, error)
	}
	// Admins checks admin tokens (several, reloadable: auth.Admins), in
	// constant time.
	Admins interface{ Valid(token string) bool }
	// UserLimit and IPLimit, when set, limit each user's and each client
	// address's rate of grabs (429 rate_limited over it).
	UserLimit, IPLimit *limit.Limiter
	// ClientIPHeader names the header a trusted proxy puts the client's
	// address in (X-Forwarded-For, X-Real-IP); empty: the peer address.
	ClientIPHeader string
	// Warnings are what the instance warned of at start that an operator
	// must not miss (user auth off, say): GET /readyz gives them to the
	// holders of an admin token.
	Warnings []string
	// Timeline is the dashboard's (GET /admin/stats); nil: no points.
	Timeline *dash.Timeline
	// GrabBodyTimeout bounds the wait for a grab's body, from the end of
	// its headers (on the listener: for its first byte, then for the rest
	// from then); the body is read before the grab takes a place in the
	// worker pool. Default DefaultGrabBodyTimeout.
	GrabBodyTimeout time.Duration
	// MaxConns is the most client connections the listener keeps open:
	// past it the connection idle the longest is closed (Listen). Default
	// DefaultMaxConns().
	MaxConns int
	// IdleTimeout is how long the listener keeps a keep-alive connection
	// idle. Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// AccessLog is how many requests a second are logged, at most (one
	// line each, with its X-Request-Id); the rest are not. 0: none.
	AccessLog int
	Logger    *slog.Logger
}

// DefaultGrabBodyTimeout is Config.GrabBodyTimeout's default. A grab's
// body is at most MaxGrabBody (4 KiB): clients send it with the headers, in
// one or two segments, so two seconds leave room for a retransmission on a
// poor mobile link, and no more.
const DefaultGrabBodyTimeout = 2 * time.Second

// Server serves rain's HTTP API: on a listener of its own (Listen, Serve,
// Shutdown), and as an http.Handler (for rain serve's side listeners).
type Server struct {
	cfg      Config
	listener *listener // Listen's
	mux      *http.ServeMux
	grabs    *metrics.Grabs
	ids      *requestIDs
	access   accessSampler
	draining atomic.Bool // Drain: /readyz 503, every answer closes its connection
	stopping atomic.Bool // Stop: grabs answered 503 before any work
	// adminFails is each client's budget of admin token failures (see
	// adminFailBurst); adminRefused counts refusals by why.
	adminFails   *limit.Limiter
	adminRefused [nFail]atomic.Int64
}

// The dashboard's files: a subtree pattern, which matches any path under
// it, whether the dashboard has the file or not.
const (
	dashPrefix  = "/admin/"
	dashPattern = "GET " + dashPrefix
)

func (c *Config) init() {
	if c.GrabBodyTimeout <= 0 {
		c.GrabBodyTimeout = DefaultGrabBodyTimeout
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns()
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New(metrics.Build{Version: "devel"})
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// New returns the API server.
func New(cfg Config) *Server {
	cfg.init()
	s := &Server{cfg: cfg, mux: http.NewServeMux(),
		grabs: cfg.Metrics.Grabs(names(nStatus), names(nReason)), ids: newRequestIDs(),
		access:     accessSampler{perSecond: int64(cfg.AccessLog)},
		adminFails: limit.New(limit.Config{Rate: adminFailRate, Burst: adminFailBurst, MaxKeys: adminFailKeys})}
	cfg.Metrics.CounterVec("rain_admin_auth_failures_total",
		"Requests refused an admin endpoint (or /readyz's details, or pprof) by why: wrong_token (missing or wrong), or throttled (the client sent too many wrong ones lately).",
		[]string{"reason"}, func() []metrics.Sample {
			out := make([]metrics.Sample, nFail)
			for i := range out {
				out[i] = metrics.Sample{Labels: []string{failNames[i]}, V: float64(s.adminRefused[i].Load())}
			}
			return out
		})
	s.mux.HandleFunc("POST /grab", s.grab)
	s.mux.HandleFunc("POST /admin/pools", s.admin(s.preload))
	s.mux.HandleFunc("GET /admin/pools", s.admin(s.list))
	s.mux.HandleFunc("GET /admin/stats", s.admin(s.stats))
	// The dashboard's page: static files, no secret in them (it asks for
	// the token, and calls the endpoints above with it).
	s.mux.Handle(dashPattern, dash.Files(dashPrefix, http.HandlerFunc(s.noRoute)))
	// rain's address opened in a browser leads to the dashboard (a JSON
	// body with the redirect); every other unknown path stays a JSON 404.
	s.mux.Handle("GET /{$}", dash.Home(dashPrefix))
	s.mux.HandleFunc("GET /admin/pools/{pool_id}", s.admin(s.status))
	s.mux.HandleFunc("GET /admin/pools/{pool_id}/audit", s.admin(s.audit))
	s.mux.HandleFunc("POST /admin/pools/{pool_id}/end", s.admin(s.endPool))
	s.mux.HandleFunc("POST /admin/pools/{pool_id}/close", s.admin(s.closePool))
	s.mux.HandleFunc("POST /admin/grants/confirm", s.admin(s.confirm))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /readyz", s.ready)
	s.mux.HandleFunc("GET /readyz/instance", s.readyInstance)
	s.mux.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(docs.OpenAPI)
	})
	s.mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
	})
	if !cfg.MetricsOff {
		s.mux.Handle("GET /metrics", cfg.Metrics.Handler())
	}
	s.mux.HandleFunc("/", s.noRoute)
	return s
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
