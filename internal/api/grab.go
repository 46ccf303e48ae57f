package api

// This file is POST /grab: admission, the run, the answer (its statuses
// and the reasons of a 503 are in status.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"rain/internal/auth"
	"rain/internal/grab"
	"rain/internal/pool"
)

// errStopping is the error of a grab that arrived after Stop.
var errStopping = errors.New("api: stopping")

func (s *Server) grab(w http.ResponseWriter, r *http.Request) {
	s.serveGrab(httpExchange{w, r})
}

// serveGrab answers one grab, on whichever server carries it.
func (s *Server) serveGrab(x exchange) {
	start := time.Now()
	if s.stopping.Load() {
		bodyUnread(x)
		s.answer(x, start, grabRequest{}, grab.Result{}, errStopping)
		return
	}
	// The client's rate first: a flood from one address costs a map lookup
	// and a short answer, and takes no place in the worker pool.
	if s.cfg.IPLimit != nil {
		if ok, wait := s.cfg.IPLimit.Allow(s.clientIP(x), start); !ok {
			bodyUnread(x)
			s.refuse(x, start, stRateLimited, grabRequest{}, "this client is over its rate of grabs", wait)
			return
		}
	}
	// With user auth on, a grab without a bearer token is refused before
	// its body is read: it costs a header lookup.
	var authorization string
	if s.cfg.Users != nil {
		authorization = x.header("Authorization")
		if _, ok := auth.BearerToken(authorization); !ok {
			s.unauthorized(x, start, auth.ErrNoToken, `Bearer realm="rain"`) // RFC 6750: no error code when no token was sent
			return
		}
	}
	// The body is read before a place is taken, under a short deadline of
	// its own: a client that sends its headers and holds its body back
	// costs its own connection, never a place the other grabs need.
	req, err := s.readGrab(x)
	if err != nil {
		s.refuse(x, start, stInvalid, req, err.Error(), 0)
		return
	}
	// Admission: under overload a shed request costs its read and a short
	// answer, nothing more (its token is not even verified). The place is
	// held until the answer.
	if s.cfg.Runner != nil {
		if !s.cfg.Runner.Admit() {
			s.answer(x, start, req, grab.Result{}, pool.ErrOverloaded)
			return
		}
		defer s.cfg.Runner.Leave()
	}
	if s.cfg.Users != nil {
		sub, err := s.cfg.Users.Subject(authorization)
		if err != nil {
			x.setHeader("WWW-Authenticate", `Bearer realm="rain", error="invalid_token"`)
			s.refuse(x, start, stUnauthorized, grabRequest{}, err.Error(), 0)
			return
		}
		if req.UserID != "" && req.UserID != sub {
			x.setHeader("WWW-Authenticate", `Bearer realm="rain", error="invalid_token"`)
			s.refuse(x, start, stUnauthorized, req, "user_id differs from the user token's subject", 0)
			return
		}
		req.UserID = sub
	}
	if s.cfg.UserLimit != nil {
		if ok, wait := s.cfg.UserLimit.Allow(req.UserID, start); !ok {
			s.refuse(x, start, stRateLimited, req, "this user is over its rate of grabs", wait)
			return
		}
	}
	res, err := s.run(x.context(), req)
	s.answer(x, start, req, res, err)
}

// readGrab reads and decodes a grab's body, which must be
// application/json, within the body timeout (Config.GrabBodyTimeout). A body that is not all there in time is an
// invalid request, answered at once, and its connection closed.
func (s *Server) readGrab(x exchange) (grabRequest, error) {
	if !x.jsonBody() {
		bodyUnread(x)
		return grabRequest{}, errNotJSON
	}
	x.setReadDeadline(time.Now().Add(s.cfg.GrabBodyTimeout))
	req, err := decodeGrab(x.body(), s.cfg.Users != nil)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		x.closeAfter()
		return req, fmt.Errorf("the body did not arrive within %v", s.cfg.GrabBodyTimeout)
	}
	if errors.Is(err, errBodyTooLarge) {
		x.closeAfter() // the rest of the body is not read
	}
	// net/http lifts the deadline itself once the body ends, as it starts
	// watching the connection for the client going away; the listener once
	// the request is answered (nothing reads the connection meanwhile): a
	// grab that runs longer than the body timeout keeps its context.
	return req, err
}

// errNotJSON refuses a grab whose Content-Type is not application/json:
// a web page can make its visitors' browsers POST a text/plain or form
// body to any address, but not an application/json one (that takes a CORS
// preflight, which rain never answers).
var errNotJSON = errors.New("the Content-Type must be application/json")

// isJSON says whether a Content-Type value is application/json (any
// parameters, charset=utf-8 say, allowed).
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// isJSONBytes is isJSON of a header's bytes, without a string or mime's
// map for the common value: application/json as it is, in any ASCII case.
// (EqualFold also folds Unicode's look-alikes, which mime.ParseMediaType
// refuses, but each is more than a byte: at the length of application/json
// only ASCII matches.) FuzzIsJSONBytes checks the two agree.
func isJSONBytes(ct []byte) bool {
	const want = "application/json"
	return len(ct) == len(want) && bytes.EqualFold(ct, []byte(want)) || isJSON(string(ct))
}

// run runs an admitted grab: on the worker pool when there is one (only
// its first part when the Grabber has two, see beginner), else on the
// handler's goroutine.
func (s *Server) run(ctx context.Context, req grabRequest) (grab.Result, error) {
	if s.cfg.Runner == nil {
		return s.cfg.Grabber.Grab(ctx, req.PoolID, req.UserID)
	}
	t := grabTasks.Get().(*grabTask)
	t.g, t.req = s.cfg.Grabber, req
	if err := s.cfg.Runner.RunTask(ctx, t); err != nil {
		return grab.Result{}, err // the task may still be running: it is not reused
	}
	// What the task set is read only once RunTask has returned nil: the
	// task has finished then.
	begun, pending, res, err := t.begun, t.pending, t.res, t.err
	*t = grabTask{}
	grabTasks.Put(t)
	if begun {
		return pending.Wait()
	}
	return res, err
}

// grabTask is a grab as a worker runs it: Begin when the Grabber has two
// parts (the request then waits for the shard's answer off the worker
// pool, in Pending.Wait), else the whole Grab. Reused through grabTasks, so
// that handing a grab to a worker allocates nothing.
type grabTask struct {
	g       Grabber
	req     grabRequest
	begun   bool // Begin ran: pending is the grab's, to Wait for
	pending grab.Pending
	res     grab.Result
	err     error
}

var grabTasks = sync.Pool{New: func() any { return new(grabTask) }}

func (t *grabTask) Run(ctx context.Context) {
	if b, ok := t.g.(beginner); ok {
		t.begun, t.pending = true, b.Begin(ctx, t.req.PoolID, t.req.UserID)
		return
	}
	t.res, t.err = t.g.Grab(ctx, t.req.PoolID, t.req.UserID)
}

// bodyUnreadWait is how long an answer given before the request's body
// was read waits for that body to arrive (net/http reads what is left
// before it answers, to keep the connection): a client that sent its
// headers and holds its body back gets the answer then, and its connection
// is closed.
const bodyUnreadWait = 100 * time.Millisecond

// bodyUnread bounds the wait for the body of a request answered without
// reading it (see bodyUnreadWait).
func bodyUnread(x exchange) {
	x.setReadDeadline(time.Now().Add(bodyUnreadWait))
}

// unauthorized answers 401 with the WWW-Authenticate challenge; the body
// has not been read, so the answer names no pool or user.
func (s *Server) unauthorized(x exchange, start time.Time, err error, challenge string) {
	bodyUnread(x)
	x.setHeader("WWW-Authenticate", challenge)
	s.refuse(x, start, stUnauthorized, grabRequest{}, err.Error(), 0)
}

// refuse answers a grab refused before any work: invalid (400),
// unauthorized (401; the caller sets WWW-Authenticate) or rate_limited (429,
// with Retry-After), with the reason in "error". Nothing was granted.
func (s *Server) refuse(x exchange, start time.Time, st status, req grabRequest, reason string, retryAfter time.Duration) {
	if st == stRateLimited {
		x.setHeader("Retry-After", strconv.FormatInt(max(1, int64((retryAfter+time.Second-1)/time.Second)), 10))
	}
	s.grabs.Answered(int(st), time.Since(start))
	replyJSON(x, st.code(), map[string]string{
		"status": st.String(), "pool_id": req.PoolID, "user_id": req.UserID, "error": reason})
}

// clientIP is the client's key for the per-IP limit: the address in the
// trusted proxy header when one is configured and present (its last
// address: the one the proxy saw), else the connection's peer; as
// ipKey makes it.
func (s *Server) clientIP(x exchange) string {
	if h := s.cfg.ClientIPHeader; h != "" {
		if last := x.lastHeader(h); last != "" {
			if i := strings.LastIndexByte(last, ','); i >= 0 {
				last = last[i+1:]
			}
			if key, ok := ipKey(strings.TrimSpace(last)); ok {
				return key
			}
		}
	}
	remote := x.remoteAddr()
	if key, ok := ipKey(remote); ok {
		return key
	}
	return remote
}

// ipKey is the rate-limit key of an address, given bare or with a port:
// an IPv4 address (also written as IPv4-mapped IPv6) is itself; an IPv6
// address is its /64, the block one subscriber gets, so that a client
// cannot step around its limit through the addresses of its own prefix.
// Spellings of one address (zero padding, case, a zone) are one key. ok
// is false when s is no address.
func ipKey(s string) (key string, ok bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return "", false
		}
		a = ap.Addr()
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String(), true
	}
	return netip.PrefixFrom(a, 64).Masked().String(), true
}

// answer writes the answer to a grab: its result, or the error it met.
func (s *Server) answer(x exchange, start time.Time, req grabRequest, res grab.Result, err error) {
	st, rs := stError, reason(-1)
	switch {
	case err == nil:
		if st = outcomeStatus(res.Outcome); st == stError {
			s.cfg.Logger.Error("grab: an outcome with no answer", "pool_id", req.PoolID, "user_id", req.UserID, "outcome", int(res.Outcome))
			rs = rsInternal
		}
	case errors.Is(err, pool.ErrOverloaded):
		rs = rsShed
	case errors.Is(err, errStopping):
		rs = rsStopping
	case errors.Is(err, pool.ErrPanicked):
		rs = rsInternal // logged by the pool
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
		rs = rsInternal
	}
	if rs >= 0 {
		st = stOverloaded
		res.RetryAfter = time.Second
		s.grabs.Overloaded(int(rs))
		if rs != rsShed && rs != rsStopping {
			s.cfg.Logger.Debug("grab overloaded", "pool_id", req.PoolID, "reason", rs.String(), "err", err)
		}
	}
	s.grabs.Answered(int(st), time.Since(start))
	if res.RetryAfter > 0 && (st == stNotStarted || st == stOverloaded) {
		secs := int64((res.RetryAfter + time.Second - 1) / time.Second)
		x.setHeader("Retry-After", strconv.FormatInt(secs, 10))
	}
	buf := answerBufs.Get().(*[]byte)
	b := appendGrab((*buf)[:0], st, req, res)
	if rs >= 0 {
		b = append(b[:len(b)-2], `,"error":"`...) // ids and reasons need no escaping
		b = append(b, rs.text()...)
		b = append(b, "\"}\n"...)
	}
	x.reply(st.code(), b) // reply copies b
	*buf = b
	answerBufs.Put(buf)
}

// answerBufs holds the buffers grab answers are written in (an answer's
// buffer would otherwise be allocated for each: reply is an interface's).
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

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
	b = append(b, st.String()...)
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
