// Package api is rain's HTTP layer: the contract of shared/API.md, and the one
// place where domain results and errors become status codes.
package api

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"rain/internal/grab"
	"rain/internal/pool"
)

// MaxGrabBody is the largest POST /grab body accepted.
const MaxGrabBody = 4 << 10

// maxAdminBody bounds operator request bodies.
const maxAdminBody = 64 << 10

// Grabber is what the grab endpoint needs.
type Grabber interface {
	Grab(ctx context.Context, poolID, userID string) (grab.Result, error)
}

// Pools is what the operator endpoints need.
type Pools interface {
	Preload(ctx context.Context, spec grab.Spec) (*grab.Status, bool, error)
	Status(ctx context.Context, id string) (*grab.Status, error)
	Audit(ctx context.Context, id string) (*grab.Report, error)
	Confirm(ctx context.Context, poolID, userID string, serial int64) error
}

// Runner runs a grab as a task (internal/pool's Pool) and waits for it.
// It returns pool.ErrOverloaded when it sheds, pool.ErrPanicked when the task
// panicked, or ctx's error when the client has gone.
type Runner interface {
	Do(ctx context.Context, fn func(ctx context.Context)) error
}

// Config wires a Server. Grabber, Pools, AdminToken and Ready are required.
type Config struct {
	Grabber    Grabber
	Pools      Pools
	AdminToken string
	// Ready reports whether every shard answers (GET /readyz).
	Ready func(ctx context.Context) error
	// Runner runs every grab; nil runs grabs on the handler goroutine
	// (rain serve --pool=off, for comparison only).
	Runner Runner
	// Metrics append more Prometheus text to GET /metrics.
	Metrics []func(b []byte) []byte
	Logger  *slog.Logger
}

// Server serves rain's HTTP API. It is an http.Handler.
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	token   []byte
	metrics metrics
}

// New returns the API server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), token: []byte(cfg.AdminToken)}
	s.mux.HandleFunc("POST /grab", s.grab)
	s.mux.HandleFunc("POST /admin/pools", s.admin(s.preload))
	s.mux.HandleFunc("GET /admin/pools/{pool_id}", s.admin(s.status))
	s.mux.HandleFunc("GET /admin/pools/{pool_id}/audit", s.admin(s.audit))
	s.mux.HandleFunc("POST /admin/grants/confirm", s.admin(s.confirm))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /readyz", s.ready)
	s.mux.HandleFunc("GET /metrics", s.serveMetrics)
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Grab statuses of API.md, indexed for the metrics.
type status int

const (
	stGranted status = iota
	stAlreadyGranted
	stSoldOut
	stNotFound
	stNotStarted
	stEnded
	stOverloaded
	stInvalid
	stError // not an API status: a 500, counted apart
	nStatus
)

var statusNames = [nStatus]string{"granted", "already_granted", "sold_out", "not_found",
	"not_started", "ended", "overloaded", "invalid", "error"}

var statusCodes = [nStatus]int{200, 200, 410, 404, 425, 410, 503, 400, 500}

// Reasons a grab is answered overloaded (503), each counted apart; the
// answer's "error" says which, and whether anything may have been granted.
type reason int

const (
	rsShed        reason = iota // the worker pool is full: refused before any work
	rsUnavailable               // a shard or the serial generator is down: nothing granted
	rsUnknown                   // a step that may grant lost its answer: a retry returns it
	rsBusy                      // the user's own spill is in flight
	rsClientGone                // the client left; the grab may still have run
	nReason
)

var reasonNames = [nReason]string{"shed", "shard_unavailable", "outcome_unknown", "busy", "client_gone"}

var reasonTexts = [nReason]string{
	"overloaded: the request was shed; nothing was granted",
	"a shard is unavailable; nothing was granted",
	"the outcome is not known yet: the grab may have been granted, and a retry returns it",
	"a grab of this user is in flight; retry shortly",
	"the request was cancelled; the grab may have been granted, and a retry returns it",
}

type metrics struct {
	grabs      [nStatus]atomic.Int64
	overloaded [nReason]atomic.Int64
}

// grabRequest is the POST /grab body.
type grabRequest struct {
	PoolID string `json:"pool_id"`
	UserID string `json:"user_id"`
}

// errBodyTooLarge is returned by decodeGrab for a body over MaxGrabBody.
var errBodyTooLarge = fmt.Errorf("body is larger than %d bytes", MaxGrabBody)

// decodeGrab reads and validates a POST /grab body: one JSON object with
// exactly the known fields, both ids valid, at most MaxGrabBody bytes.
func decodeGrab(body io.Reader) (grabRequest, error) {
	var req grabRequest
	bp := bodyPool.Get().(*[MaxGrabBody + 1]byte)
	defer bodyPool.Put(bp)
	n, err := io.ReadFull(body, bp[:])
	switch {
	case n > MaxGrabBody:
		return req, errBodyTooLarge
	case err != nil && err != io.EOF && err != io.ErrUnexpectedEOF:
		return req, fmt.Errorf("reading body: %w", err)
	}
	buf := bp[:n]
	if fast, ok := fastGrab(buf); ok {
		return fast, nil
	}
	if err := decodeStrict(buf, &req); err != nil {
		return req, err
	}
	switch {
	case !grab.ValidID(req.PoolID):
		return req, errors.New("pool_id must be 1-64 characters from A-Z a-z 0-9 _ - . :")
	case !grab.ValidID(req.UserID):
		return req, errors.New("user_id must be 1-64 characters from A-Z a-z 0-9 _ - . :")
	}
	return req, nil
}

// bodyPool holds grab body buffers: one more byte than allowed, to tell a
// body at the limit from one over it.
var bodyPool = sync.Pool{New: func() any { return new([MaxGrabBody + 1]byte) }}

// fastGrab parses the common body, {"pool_id":"…","user_id":"…"} in either
// order with any JSON whitespace and ids of valid characters only, without
// encoding/json. Anything else (escapes, other or repeated keys, invalid ids,
// malformed input) returns ok = false and goes to the strict decoder, which
// accepts or refuses it; FuzzDecodeGrab checks the two always agree.
func fastGrab(b []byte) (req grabRequest, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return req, false
	}
	var havePool, haveUser bool
	for {
		i = skipSpace(b, i+1)
		key, j, ok := fastString(b, i)
		if !ok {
			return req, false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return req, false
		}
		i = skipSpace(b, i+1)
		val, j, ok := fastString(b, i)
		if !ok || len(val) == 0 || len(val) > grab.MaxIDLen {
			return req, false
		}
		switch string(key) {
		case "pool_id":
			if havePool {
				return req, false
			}
			havePool, req.PoolID = true, string(val)
		case "user_id":
			if haveUser {
				return req, false
			}
			haveUser, req.UserID = true, string(val)
		default:
			return req, false
		}
		i = skipSpace(b, j)
		if i >= len(b) {
			return req, false
		}
		if b[i] == '}' {
			break
		}
		if b[i] != ',' {
			return req, false
		}
	}
	if skipSpace(b, i+1) != len(b) || !havePool || !haveUser {
		return req, false
	}
	return req, true
}

// fastString reads a JSON string at b[i] made only of id characters (which
// need no escaping) and returns its contents and the index after it.
func fastString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		c := b[j]
		if c == '"' {
			return b[i+1 : j], j + 1, true
		}
		if !idByte(c) {
			return nil, 0, false
		}
	}
	return nil, 0, false
}

func idByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == '-' || c == '.' || c == ':'
}

// skipSpace returns the index of the first non-whitespace byte at or after i.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// decodeStrict decodes exactly one JSON object with no unknown fields.
func decodeStrict(buf []byte, v any) error {
	if i := skipSpace(buf, 0); i == len(buf) || buf[i] != '{' {
		return errors.New("malformed JSON: the body must be an object")
	}
	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if dec.More() {
		return errors.New("malformed JSON: more than one value in the body")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("malformed JSON: trailing data after the object")
	}
	return nil
}

func (s *Server) grab(w http.ResponseWriter, r *http.Request) {
	req, err := decodeGrab(r.Body)
	if err != nil {
		s.metrics.grabs[stInvalid].Add(1)
		writeJSON(w, http.StatusBadRequest, map[string]string{
			"status": "invalid", "pool_id": req.PoolID, "user_id": req.UserID, "error": err.Error()})
		return
	}
	var res grab.Result
	if s.cfg.Runner == nil {
		res, err = s.cfg.Grabber.Grab(r.Context(), req.PoolID, req.UserID)
	} else {
		var tres grab.Result
		var terr error
		// tres and terr are read only when Do returns nil: the task has
		// finished then; on any error it may still be running.
		err = s.cfg.Runner.Do(r.Context(), func(ctx context.Context) {
			tres, terr = s.cfg.Grabber.Grab(ctx, req.PoolID, req.UserID)
		})
		if err == nil {
			res, err = tres, terr
		}
	}
	st, rs := stError, reason(-1)
	switch {
	case err == nil:
		st = outcomeStatus(res.Outcome)
	case errors.Is(err, pool.ErrOverloaded):
		rs = rsShed
	case errors.Is(err, pool.ErrPanicked):
		// Logged by the pool; the request gets a 500 below.
	case errors.Is(err, grab.ErrOutcomeUnknown):
		rs = rsUnknown
	case errors.Is(err, grab.ErrBusy):
		rs = rsBusy
	case errors.Is(err, grab.ErrUnavailable):
		rs = rsUnavailable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		rs = rsClientGone
	default:
		s.cfg.Logger.Error("grab failed", "pool_id", req.PoolID, "user_id", req.UserID, "err", err)
	}
	if rs >= 0 {
		st = stOverloaded
		res.RetryAfter = time.Second
		s.metrics.overloaded[rs].Add(1)
		if rs != rsShed {
			s.cfg.Logger.Debug("grab overloaded", "pool_id", req.PoolID, "reason", reasonNames[rs], "err", err)
		}
	}
	s.metrics.grabs[st].Add(1)
	if st == stError {
		writeJSON(w, http.StatusInternalServerError, map[string]string{
			"status": "error", "pool_id": req.PoolID, "user_id": req.UserID, "error": "internal error"})
		return
	}
	if res.RetryAfter > 0 && (st == stNotStarted || st == stOverloaded) {
		secs := int64((res.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(statusCodes[st])
	b := appendGrab(make([]byte, 0, 192), st, req, res)
	if rs >= 0 {
		b = append(b[:len(b)-2], `,"error":"`...) // ids and reasons need no escaping
		b = append(b, reasonTexts[rs]...)
		b = append(b, "\"}\n"...)
	}
	_, _ = w.Write(b)
}

func outcomeStatus(o grab.Outcome) status {
	switch o {
	case grab.Granted:
		return stGranted
	case grab.AlreadyGranted:
		return stAlreadyGranted
	case grab.SoldOut:
		return stSoldOut
	case grab.NotFound:
		return stNotFound
	case grab.NotStarted:
		return stNotStarted
	case grab.Ended:
		return stEnded
	}
	return stError
}

// appendGrab writes the grab response by hand: ids are validated to need no
// JSON escaping, so this is exact and cheaper than encoding/json.
func appendGrab(b []byte, st status, req grabRequest, res grab.Result) []byte {
	b = append(b, `{"status":"`...)
	b = append(b, statusNames[st]...)
	b = append(b, `","pool_id":"`...)
	b = append(b, req.PoolID...)
	b = append(b, `","user_id":"`...)
	b = append(b, req.UserID...)
	b = append(b, '"')
	if st == stGranted || st == stAlreadyGranted {
		b = append(b, `,"amount_cents":`...)
		b = strconv.AppendInt(b, res.Amount, 10)
		b = append(b, `,"serial":`...)
		b = strconv.AppendInt(b, res.Serial, 10)
		b = append(b, `,"expires_at":"`...)
		b = res.ExpiresAt.UTC().AppendFormat(b, time.RFC3339Nano)
		b = append(b, '"')
	}
	return append(b, "}\n"...)
}

// admin wraps an operator endpoint with the bearer token check.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || len(s.token) == 0 || subtle.ConstantTimeCompare([]byte(got), s.token) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="rain"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or wrong admin token"})
			return
		}
		h(w, r)
	}
}

func (s *Server) preload(w http.ResponseWriter, r *http.Request) {
	buf, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil || len(buf) > maxAdminBody {
		writeError(w, http.StatusBadRequest, fmt.Errorf("body unreadable or larger than %d bytes", maxAdminBody))
		return
	}
	var spec grab.Spec
	if err := decodeStrict(buf, &spec); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	st, created, err := s.cfg.Pools.Preload(r.Context(), spec)
	if err != nil {
		s.adminError(w, "preload", spec.PoolID, err)
		return
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
		s.cfg.Logger.Info("pool preloaded", "pool_id", spec.PoolID, "count", spec.Count, "total_cents", spec.TotalCents)
	}
	writeJSON(w, code, st)
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("pool_id")
	if !grab.ValidID(id) {
		writeError(w, http.StatusBadRequest, errors.New("pool_id must be 1-64 characters from A-Z a-z 0-9 _ - . :"))
		return
	}
	st, err := s.cfg.Pools.Status(r.Context(), id)
	if err != nil {
		s.adminError(w, "status", id, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("pool_id")
	if !grab.ValidID(id) {
		writeError(w, http.StatusBadRequest, errors.New("pool_id must be 1-64 characters from A-Z a-z 0-9 _ - . :"))
		return
	}
	rep, err := s.cfg.Pools.Audit(r.Context(), id)
	if err != nil {
		s.adminError(w, "audit", id, err)
		return
	}
	if !rep.OK {
		s.cfg.Logger.Warn("audit found problems", "pool_id", id, "problems", len(rep.Problems))
	}
	writeJSON(w, http.StatusOK, rep)
}

// confirmRequest is the POST /admin/grants/confirm body.
type confirmRequest struct {
	PoolID string `json:"pool_id"`
	UserID string `json:"user_id"`
	Serial int64  `json:"serial"`
}

func (s *Server) confirm(w http.ResponseWriter, r *http.Request) {
	buf, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil || len(buf) > maxAdminBody {
		writeError(w, http.StatusBadRequest, fmt.Errorf("body unreadable or larger than %d bytes", maxAdminBody))
		return
	}
	var req confirmRequest
	if err := decodeStrict(buf, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	switch {
	case !grab.ValidID(req.PoolID):
		writeError(w, http.StatusBadRequest, errors.New("pool_id must be 1-64 characters from A-Z a-z 0-9 _ - . :"))
		return
	case !grab.ValidID(req.UserID):
		writeError(w, http.StatusBadRequest, errors.New("user_id must be 1-64 characters from A-Z a-z 0-9 _ - . :"))
		return
	case req.Serial <= 0:
		writeError(w, http.StatusBadRequest, errors.New("serial must be a positive integer"))
		return
	}
	err = s.cfg.Pools.Confirm(r.Context(), req.PoolID, req.UserID, req.Serial)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]string{"status": "confirmed"})
	case errors.Is(err, grab.ErrGrantReleased), errors.Is(err, grab.ErrSerialMismatch):
		writeError(w, http.StatusConflict, err)
	case errors.Is(err, grab.ErrNoGrant):
		writeError(w, http.StatusNotFound, err)
	default:
		s.adminError(w, "confirm", req.PoolID, err)
	}
}

// adminError maps a domain error of an operator endpoint to its status.
func (s *Server) adminError(w http.ResponseWriter, op, pool string, err error) {
	switch {
	case errors.Is(err, grab.ErrInvalid):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, grab.ErrConflict):
		writeError(w, http.StatusConflict, err)
	case errors.Is(err, grab.ErrNotFound):
		writeError(w, http.StatusNotFound, err)
	case errors.Is(err, grab.ErrUnavailable):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, err)
	default:
		s.cfg.Logger.Error(op+" failed", "pool_id", pool, "err", err)
		writeError(w, http.StatusInternalServerError, errors.New("internal error"))
	}
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

// GrabCounts returns the grab counters by status name (for tests and logs).
func (s *Server) GrabCounts() map[string]int64 {
	m := make(map[string]int64, nStatus)
	for st := range nStatus {
		m[statusNames[st]] = s.metrics.grabs[st].Load()
	}
	return m
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
