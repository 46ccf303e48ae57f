package main

// This file is rain serve's side listeners (--admin-listen,
// --metrics-listen, --debug-listen) and rain settle's health listener,
// each an HTTP server of its own with the timeouts of the main one, so
// that none can be held open by a client that sends slowly, reads slowly
// or idles.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"rain/internal/api"
)

// The side listeners take the limits of the API's (api.MaxHeaderBytes and
// the timeouts beside it).
const (
	// debugWriteTimeout is the pprof listener's: a CPU profile or a
	// trace takes as long as it is asked to (30 s by default), and pprof
	// refuses one that would outlast the write timeout.
	debugWriteTimeout = 2 * time.Minute
	// healthIdleTimeout is how long rain settle's health listener keeps
	// an idle connection (rain serve's listeners take --idle-timeout).
	healthIdleTimeout = 30 * time.Second
)

// newHTTPServer is an HTTP server of h with rain's limits, the write
// timeout given, idle connections closed after idle.
func newHTTPServer(h http.Handler, write, idle time.Duration, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		MaxHeaderBytes:    api.MaxHeaderBytes,
		ReadHeaderTimeout: api.ReadHeaderTimeout,
		ReadTimeout:       api.ReadTimeout,
		WriteTimeout:      write,
		IdleTimeout:       idle,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// listenApart opens the side listeners the flags ask for.
func (s *server) listenApart() error {
	c := s.cfg
	if c.AdminListen != "" {
		if err := s.apartOn("admin-listen", c.AdminListen, s.in.API.Admin(), api.WriteTimeout); err != nil {
			return err
		}
	}
	if c.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", s.in.Metrics.Handler())
		mux.HandleFunc("/", metricsNoRoute)
		if err := s.apartOn("metrics-listen", c.MetricsListen, mux, api.WriteTimeout); err != nil {
			return err
		}
	}
	if c.DebugListen != "" {
		// Behind the admin token: profiles show the process's insides,
		// and a profile or a trace costs CPU for as long as it is asked.
		// No /debug/pprof/cmdline: the command line holds every secret
		// given as a flag.
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		if err := s.apartOn("debug-listen", c.DebugListen, s.in.API.RequireAdmin(mux), debugWriteTimeout); err != nil {
			return err
		}
	}
	return nil
}

// metricsNoRoute answers what the metrics listener does not serve as
// every answer of rain is (API.md): JSON, 405 for /metrics with another
// method than GET, 404 for any other path.
func metricsNoRoute(w http.ResponseWriter, r *http.Request) {
	code, msg := http.StatusNotFound, fmt.Sprintf("no endpoint %s %s: this listener serves GET /metrics", r.Method, r.URL.Path)
	if r.URL.Path == "/metrics" {
		code, msg = http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on /metrics; allowed: GET, HEAD", r.Method)
		w.Header().Set("Allow", "GET, HEAD")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// apartOn serves h on addr (the value of --flag) until shutdown.
func (s *server) apartOn(flag, addr string, h http.Handler, write time.Duration) error {
	stop, err := serveApart(flag, addr, newHTTPServer(h, write, s.cfg.IdleTimeout, s.log), s.log)
	if err != nil {
		return err
	}
	s.apart = append(s.apart, stop)
	return nil
}

// serveApart serves srv on addr (the value of --flag), on a listener of
// its own so that it is never exposed with the API; stop shuts it down.
func serveApart(flag, addr string, srv *http.Server, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flag, err)
	}
	log.Info("listening apart", "flag", flag, "addr", ln.Addr().String())
	return serveOn(ln, srv), nil
}

// serveOn serves srv on ln in the background; stop shuts it down.
func serveOn(ln net.Listener, srv *http.Server) (stop func()) {
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
}
