package main

// This file is rain serve's side listeners (--admin-listen,
// --metrics-listen, --debug-listen), each served by api.ServeApart with
// the limits, timeouts and JSON refusals of the main listener.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"rain/internal/api"
)

// The side listeners take the limits of the API's (api.MaxHeaderBytes and
// the timeouts beside it).
const (
	// maxProfile and maxTrace are the longest CPU profile and execution
	// trace the pprof listener takes (pprof's defaults: 30 s and 1 s). A
	// busy process's trace is megabytes a second, held in memory whole.
	maxProfile = 2 * time.Minute
	maxTrace   = 10 * time.Second
	// healthIdleTimeout is how long rain settle's health listener keeps
	// an idle connection (rain serve's listeners take --idle-timeout).
	healthIdleTimeout = 30 * time.Second
)

// listenApart opens the side listeners the flags ask for.
func (s *server) listenApart() error {
	c := s.cfg
	if c.AdminListen != "" {
		if err := s.apartOn("admin-listen", c.AdminListen, s.in.API.Admin()); err != nil {
			return err
		}
	}
	if c.MetricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", s.in.Metrics.Handler())
		mux.HandleFunc("/", metricsNoRoute)
		if err := s.apartOn("metrics-listen", c.MetricsListen, mux); err != nil {
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
		if err := s.apartOn("debug-listen", c.DebugListen, s.in.API.RequireAdmin(boundProfiles(mux))); err != nil {
			return err
		}
	}
	return nil
}

// boundProfiles is h with a bound on a profile's or a trace's length
// (seconds=, in the query or a form body, as pprof reads it): at most
// maxProfile for a CPU profile and maxTrace for a trace. One runs on for as
// long as it was asked, even once its client has gone, and its answer is
// held whole in memory until it ends (the listener's adaptor buffers it).
func boundProfiles(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		most := maxProfile
		if strings.HasSuffix(r.URL.Path, "/trace") {
			most = maxTrace
		}
		if v := r.FormValue("seconds"); v != "" {
			if sec, err := strconv.ParseFloat(v, 64); err == nil && sec > most.Seconds() {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf("seconds=%s: at most %v", v, most)})
				return
			}
		}
		h.ServeHTTP(w, r)
	})
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

// apartOn serves h on addr (the value of --flag) until shutdown, on a
// listener of its own so that it is never exposed with the API.
func (s *server) apartOn(flag, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	s.log.Info("listening apart", "flag", flag, "addr", ln.Addr().String())
	s.apart = append(s.apart, api.ServeApart(ln, h, api.WriteTimeout, s.cfg.IdleTimeout, s.log))
	return nil
}
