package api

// This file is the operator endpoints, behind the admin token.

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"rain"
	"rain/internal/auth"
	"rain/internal/dash"
)

// maxAdminBody bounds operator request bodies.
const maxAdminBody = 64 << 10

// readJSON decodes an operator request's body, at most maxAdminBody bytes,
// strictly into v; on failure it answers 400 with the reason and reports
// false.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	buf, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			err = fmt.Errorf("body is larger than %d bytes", maxAdminBody)
		}
		writeError(w, http.StatusBadRequest, err)
		return false
	}
	if err := decodeStrict(buf, v); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return false
	}
	return true
}

// admin wraps an operator endpoint with the bearer token check.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.refuseAdmin(w, r) {
			return
		}
		h(w, r)
	}
}

// RequireAdmin serves h to the holders of an admin token only, with the
// operator endpoints' answers and limits (rain serve puts its pprof
// listener behind it).
func (s *Server) RequireAdmin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.refuseAdmin(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// refuseAdmin answers a request without a valid admin token, and one from
// a client whose failures are throttled (the token not looked at, so that
// the answer tells nothing of it, with Retry-After), with 401: without a
// valid token an operator request is answered 401 (API.md). It reports
// whether it refused.
func (s *Server) refuseAdmin(w http.ResponseWriter, r *http.Request) bool {
	ok, wait := s.adminAuth(r)
	if ok {
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="rain"`)
	msg := "missing or wrong admin token"
	if wait > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64((wait+time.Second-1)/time.Second), 10))
		msg = "too many wrong admin tokens from this client; retry later"
	}
	writeJSON(w, http.StatusUnauthorized, map[string]string{"error": msg})
	return true
}

// Admin token failures are limited per client: after adminFailBurst
// wrong or missing tokens, a client gets one more try every
// 1/adminFailRate seconds, and meanwhile every admin request it makes is
// refused without its token being looked at. A guess at a token of 16
// random bytes is hopeless anyway; the limit keeps a leaked short list of
// candidates, or a script gone wrong, from hammering the operator API,
// and rain_admin_auth_failures_total shows it.
const (
	adminFailBurst = 10
	adminFailRate  = 1.0 / 6
	adminFailKeys  = 10_000
)

// adminAuth checks the request's admin token: ok, or refused; wait > 0
// when the client is throttled (see adminFailBurst). A failure counts
// against the client, and in rain_admin_auth_failures_total.
func (s *Server) adminAuth(r *http.Request) (ok bool, wait time.Duration) {
	now := time.Now()
	client := s.clientIP(httpExchange{r: r})
	if free, wait := s.adminFails.Peek(client, now); !free {
		s.adminRefused[failThrottled].Add(1)
		return false, wait
	}
	got, _ := auth.BearerToken(r.Header.Get("Authorization"))
	if s.cfg.Admins.Valid(got) {
		return true, 0
	}
	s.adminRefused[failWrongToken].Add(1)
	if free, _ := s.adminFails.Allow(client, now); !free {
		s.cfg.Logger.Warn("admin token failures throttled: a client keeps sending wrong admin tokens", "client", client,
			"path", r.URL.Path)
	}
	return false, 0
}

// Why an admin request was refused, counted apart in
// rain_admin_auth_failures_total{reason}.
const (
	failWrongToken = iota // a missing or wrong token
	failThrottled         // the client's failures are throttled
	nFail
)

var failNames = [nFail]string{"wrong_token", "throttled"}

func (s *Server) preload(w http.ResponseWriter, r *http.Request) {
	var spec rain.Spec
	if !readJSON(w, r, &spec) {
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
	id, ok := poolIDOf(w, r)
	if !ok {
		return
	}
	st, err := s.cfg.Pools.Status(r.Context(), id)
	if err != nil {
		s.adminError(w, "status", id, err)
		return
	}
	writeStatus(w, st)
}

// poolIDOf is the request's {pool_id}; a bad one is answered 400 (ok false).
func poolIDOf(w http.ResponseWriter, r *http.Request) (id string, ok bool) {
	id = r.PathValue("pool_id")
	if err := rain.CheckID("pool_id", id); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return "", false
	}
	return id, true
}

// writeStatus answers a pool's status: a closed pool's is its account.
func writeStatus(w http.ResponseWriter, st *rain.Status) {
	if st.Account != nil {
		writeJSON(w, http.StatusOK, st.Account)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// endPool answers POST /admin/pools/{pool_id}/end: the pool ends now (200 with
// its status; idempotent).
func (s *Server) endPool(w http.ResponseWriter, r *http.Request) {
	id, ok := poolIDOf(w, r)
	if !ok {
		return
	}
	st, err := s.cfg.Pools.End(r.Context(), id)
	if err != nil {
		s.adminError(w, "end", id, err)
		return
	}
	s.cfg.Logger.Info("pool ended", "pool_id", id)
	writeStatus(w, st)
}

// closePool answers POST /admin/pools/{pool_id}/close: the final account (200),
// or 409 with what keeps the pool from closing.
func (s *Server) closePool(w http.ResponseWriter, r *http.Request) {
	id, ok := poolIDOf(w, r)
	if !ok {
		return
	}
	a, err := s.cfg.Pools.Close(r.Context(), id)
	if err != nil {
		s.adminError(w, "close", id, err)
		return
	}
	s.cfg.Logger.Info("pool closed", "pool_id", id, "confirmed_cents", a.ConfirmedCents, "unclaimed_cents", a.UnclaimedCents)
	writeJSON(w, http.StatusOK, a)
}

func (s *Server) audit(w http.ResponseWriter, r *http.Request) {
	id, ok := poolIDOf(w, r)
	if !ok {
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

// list answers GET /admin/pools: {"pools": [ids, sorted]}.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	ids, err := s.cfg.Pools.ReadList(r.Context())
	if errors.Is(err, rain.ErrPartial) {
		err = nil // the pools of the shards that answered
	}
	if err != nil {
		s.adminError(w, "list", "", err)
		return
	}
	if ids == nil {
		ids = []string{}
	}
	writeJSON(w, http.StatusOK, map[string][]string{"pools": ids})
}

// stats answers GET /admin/stats[?since=RFC3339 time]: the dashboard's
// timeline, one point a second for the last five minutes (those after
// since only).
func (s *Server) stats(w http.ResponseWriter, r *http.Request) {
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("since %q: want an RFC 3339 time", v))
			return
		}
		since = t
	}
	points := []dash.Point{}
	if s.cfg.Timeline != nil {
		points = s.cfg.Timeline.Points(since)
	}
	writeJSON(w, http.StatusOK, map[string]any{"points": points})
}

// confirmRequest is the POST /admin/grants/confirm body.
type confirmRequest struct {
	PoolID string `json:"pool_id"`
	UserID string `json:"user_id"`
	Serial int64  `json:"serial"`
}

func (s *Server) confirm(w http.ResponseWriter, r *http.Request) {
	var req confirmRequest
	if !readJSON(w, r, &req) {
		return
	}
	if err := errors.Join(rain.CheckID("pool_id", req.PoolID), rain.CheckID("user_id", req.UserID)); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	switch {
	case req.Serial <= 0:
		writeError(w, http.StatusBadRequest, errors.New("serial must be a positive integer"))
		return
	}
	err := s.cfg.Pools.Confirm(r.Context(), req.PoolID, req.UserID, req.Serial)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]string{"status": "confirmed"})
	case errors.Is(err, rain.ErrGrantReleased), errors.Is(err, rain.ErrSerialMismatch):
		writeDomainError(w, http.StatusConflict, err)
	case errors.Is(err, rain.ErrNoGrant):
		writeDomainError(w, http.StatusNotFound, err)
	default:
		s.adminError(w, "confirm", req.PoolID, err)
	}
}

// adminError maps a domain error of an operator endpoint to its status.
func (s *Server) adminError(w http.ResponseWriter, op, pool string, err error) {
	switch {
	case errors.Is(err, rain.ErrInvalid):
		writeDomainError(w, http.StatusBadRequest, err)
	case errors.Is(err, rain.ErrConflict), errors.Is(err, rain.ErrNotNow):
		writeDomainError(w, http.StatusConflict, err)
	case errors.Is(err, rain.ErrNotFound):
		writeDomainError(w, http.StatusNotFound, err)
	case errors.Is(err, rain.ErrUnavailable):
		// The answer names the shard; its error, with the address, is the
		// operator's, in the log.
		s.cfg.Logger.Warn(op+": a shard did not answer", "pool_id", pool, "err", err)
		w.Header().Set("Retry-After", "1")
		writeDomainError(w, http.StatusServiceUnavailable, err)
	default:
		s.cfg.Logger.Error(op+" failed", "pool_id", pool, "err", err)
		writeError(w, http.StatusInternalServerError, errors.New("internal error"))
	}
}

// writeDomainError answers a domain error with what a client may read of
// it (rain.ClientText): its code and reason, never its cause.
func writeDomainError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": rain.ClientText(err)})
}
