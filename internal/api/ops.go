package api

// This file is what operations probe: readiness.

import (
	"context"
	"net/http"
	"time"

	"rain/internal/grab"
)

// readyTimeout bounds GET /readyz, whatever the shards do: the check is
// given less than that (its pings honour the deadline).
const readyTimeout = time.Second

// ready answers 200 when every shard is up (or slow), 503 when one is not
// (API.md). Only a holder of an admin token is told each shard's state
// (their errors name internal addresses) and the instance's warnings; the
// others, load balancers' probes among them, get {"ready": bool}. A wrong
// token counts as a failed admin login (and is throttled like one).
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "draining": true})
		return
	}
	details := false
	if r.Header.Get("Authorization") != "" {
		details, _ = s.adminAuth(r)
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout*8/10)
	defer cancel()
	rd := s.cfg.Ready(ctx)
	code := http.StatusOK
	if !rd.Ready {
		code = http.StatusServiceUnavailable
	}
	if !details {
		writeJSON(w, code, map[string]bool{"ready": rd.Ready})
		return
	}
	writeJSON(w, code, readiness{Readiness: rd, Warnings: s.cfg.Warnings})
}

// readyInstance answers whether this instance should get traffic, whatever
// the shards do: 503 while it drains, or while it cannot reach the shards
// for a fault of its own (out of file descriptors), else 200. It is for a
// load balancer that takes an instance out on a 503: GET /readyz (API.md)
// is 503 while any shard is down, which every instance sees alike, and
// such a balancer would take them all out; one bad shard must stay one
// bad shard (its users answered 503 by its breaker, the others served).
func (s *Server) readyInstance(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "draining": true})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout*8/10)
	defer cancel()
	if rd := s.cfg.Ready(ctx); rd.Process != "" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"ready": false, "process": rd.Process})
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"ready": true})
}

// readiness is GET /readyz's answer to an operator: the shards' states,
// and what the instance warned of at start.
type readiness struct {
	grab.Readiness
	Warnings []string `json:"warnings,omitempty"`
}

// Drain makes GET /readyz answer 503 {"ready":false,"draining":true} from
// now on, and every answer close its connection (Connection: close): the
// first step of a graceful stop, so that load balancers stop sending and
// keep-alive clients reconnect elsewhere before the listener closes. No
// connection is closed under a request: each closes after its answer.
func (s *Server) Drain() { s.draining.Store(true) }

// Stop makes every grab from now on answer 503 overloaded with
// Retry-After: 1 ("this instance is shutting down; nothing was granted")
// before any work, and close its connection; it implies Drain. The second
// step of a graceful stop, after the drain delay: a client that still
// comes is told to retry later (elsewhere), so that by the time the
// listener closes no well-behaved client is connecting to it. Grabs
// already running are answered as usual.
func (s *Server) Stop() {
	s.draining.Store(true)
	s.stopping.Store(true)
}
