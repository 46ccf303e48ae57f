package api

// This file is what every request goes through: its request id, the
// sampled access log, and JSON answers for requests no route takes.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"rain/internal/dash"
)

// requestIDs makes request ids: a random prefix per process and a count,
// unique without coordination and cheap enough for every grab.
type requestIDs struct {
	prefix string
	n      atomic.Uint64
}

func newRequestIDs() *requestIDs {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return &requestIDs{prefix: hex.EncodeToString(b) + "-"}
}

func (g *requestIDs) next() string {
	return string(g.appendNext(nil))
}

// appendNext appends a new id to dst.
func (g *requestIDs) appendNext(dst []byte) []byte {
	return strconv.AppendUint(append(dst, g.prefix...), g.n.Add(1), 36)
}

// maxRequestID bounds a request id taken from the request.
const maxRequestID = 128

// requestID returns the request's X-Request-Id when it is a sane one
// (printable ASCII, at most maxRequestID bytes), else a new id.
func (s *Server) requestID(r *http.Request) string {
	if v := r.Header["X-Request-Id"]; len(v) == 1 && saneRequestID(v[0]) {
		return v[0]
	}
	return s.ids.next()
}

// saneRequestID says whether a request id from a request can be used:
// printable ASCII, at most maxRequestID bytes.
func saneRequestID[T string | []byte](id T) bool {
	if len(id) == 0 || len(id) > maxRequestID {
		return false
	}
	for i := range len(id) {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return false
		}
	}
	return true
}

// accessSampler admits at most perSecond access log lines a second: every
// request is logged under light load, a sample of them under a flood.
type accessSampler struct {
	perSecond int64
	second    atomic.Int64 // unix second of the current window
	used      atomic.Int64 // lines logged in it
}

func (a *accessSampler) admit(now time.Time) bool {
	if a.perSecond <= 0 {
		return false
	}
	sec := now.Unix()
	if old := a.second.Load(); old != sec && a.second.CompareAndSwap(old, sec) {
		a.used.Store(0)
	}
	return a.used.Add(1) <= a.perSecond
}

// statusRecorder remembers the status an answer was written with.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// ServeHTTP answers r: every answer carries X-Request-Id (the request's own
// when it sent a sane one), and Connection: close once draining; a sample
// of them is logged. With Config.AdminOff the operator endpoints and the
// dashboard are not here (404): Admin serves them.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, !s.cfg.AdminOff, true)
}

// Admin serves the operator endpoints and the dashboard (every path under
// /admin/, and / which leads to it) and nothing else, for a listener of their own (rain serve
// --admin-listen), apart from the clients' network.
func (s *Server) Admin() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, true, false) })
}

// isAdminPath says whether an (unescaped) path is the operator's: /admin,
// under /admin/, or / (which leads a browser to the dashboard). ServeMux
// redirects a path that is not clean (//admin, /x/../admin) to its clean
// form first, which is then asked again.
func isAdminPath(path string) bool {
	return path == "/" || path == "/admin" || strings.HasPrefix(path, "/admin/")
}

// serve answers r as ServeHTTP says, the operator's paths only when admin,
// the others only when public (the rest are 404).
func (s *Server) serve(w http.ResponseWriter, r *http.Request, admin, public bool) {
	id := s.requestID(r)
	w.Header()["X-Request-Id"] = []string{id}
	if s.draining.Load() {
		w.Header()["Connection"] = []string{"close"} // see Drain
	}
	var h http.Handler = s.mux
	if isAdminPath(r.URL.Path) && !admin || !isAdminPath(r.URL.Path) && !public {
		h = http.HandlerFunc(notHere)
	}
	start := time.Now()
	if !s.access.admit(start) {
		h.ServeHTTP(w, r)
		return
	}
	rec := &statusRecorder{ResponseWriter: w}
	h.ServeHTTP(rec, r)
	s.cfg.Logger.Info("http", "request_id", id, "method", r.Method, "path", r.URL.Path,
		"status", rec.code, "duration_ms", float64(time.Since(start).Microseconds())/1000,
		"remote", r.RemoteAddr)
}

// notHere answers 404 for a path this listener does not serve (see serve).
func notHere(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusNotFound, map[string]string{"status": "not_found",
		"error": fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path)})
}

// methods are those a route may be registered for.
var methods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// noRoute answers a request that no route takes, in JSON: 405 with Allow
// when the path has routes for other methods, else 404.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	var allowed []string
	for _, m := range methods {
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		// The catch-all and the dashboard's subtree (for a path that is no
		// file of it) are no endpoint: they allow no method.
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/" &&
			(pattern != dashPattern || dash.Has(dashPrefix, r.URL.Path)) {
			allowed = append(allowed, m)
		}
	}
	if len(allowed) > 0 && !slices.Contains(allowed, r.Method) && !(r.Method == http.MethodHead && slices.Contains(allowed, http.MethodGet)) {
		if slices.Contains(allowed, http.MethodGet) {
			allowed = append(allowed, http.MethodHead)
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"status": "invalid",
			"error": fmt.Sprintf("method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, strings.Join(allowed, ", "))})
		return
	}
	writeJSON(w, http.StatusNotFound, map[string]string{"status": "not_found",
		"error": fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path)})
}
