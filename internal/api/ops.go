package api

// This file is what operations probe: readiness and the metrics.

import (
	"fmt"
	"net/http"
	"sync/atomic"
)

type metrics struct {
	grabs      [nStatus]atomic.Int64
	overloaded [nReason]atomic.Int64
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Ready(r.Context()); err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
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
