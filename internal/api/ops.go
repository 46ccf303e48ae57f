package api

// This file is what operations probe: readiness and the metrics.

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

type metrics struct {
	grabs      [nStatus]atomic.Int64
	overloaded [nReason]atomic.Int64
}

// readyTimeout bounds GET /readyz, whatever the shards do: the check is
// given less than that (its pings honour the deadline).
const readyTimeout = time.Second

// ready answers 200 when every shard a live pool depends on is up, 503 when
// one is not, with each shard's state.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout*8/10)
	defer cancel()
	rd := s.cfg.Ready(ctx)
	code := http.StatusOK
	if !rd.Ready {
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, rd)
}

func (s *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	var b []byte
	b = append(b, "# HELP rain_grabs_total Grab requests answered, by status.\n# TYPE rain_grabs_total counter\n"...)
	for st := range nStatus {
		b = fmt.Appendf(b, "rain_grabs_total{status=%q} %d\n", statusNames[st], s.metrics.grabs[st].Load())
	}
	b = append(b, "# HELP rain_grab_overloaded_total Grabs answered 503 overloaded, by reason.\n# TYPE rain_grab_overloaded_total counter\n"...)
	for rs := range nReason {
		b = fmt.Appendf(b, "rain_grab_overloaded_total{reason=%q} %d\n", reasonNames[rs], s.metrics.overloaded[rs].Load())
	}
	for _, m := range s.cfg.Metrics {
		b = m(b)
	}
	_, _ = w.Write(b)
}
