package api

// This file is the API's listener: Listen, Serve and Shutdown, its limits,
// the connection cap (conns.go), JSON answers to requests the server
// refuses before any route, and the order of a graceful stop. POST /grab
// is served natively (exchange.go); every other route goes through the
// net/http handler (ServeHTTP) by an adaptor, which costs them a few
// microseconds the hot path does not pay.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

// Limits of every HTTP server of rain's (the listener here, and those of
// ServeApart): a request's headers within
// ReadHeaderTimeout and at most MaxHeaderBytes (more is answered 431,
// JSON), the rest of the request within ReadTimeout (a grab's body within
// Config.GrabBodyTimeout), its answer within WriteTimeout.
const (
	MaxHeaderBytes    = 16 << 10
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 10 * time.Second
	WriteTimeout      = 30 * time.Second
)

// DefaultIdleTimeout is Config.IdleTimeout's default.
const DefaultIdleTimeout = 30 * time.Second

// stopLinger is how long the listener stays open after grabs are answered
// 503 (Retry-After: 1) at shutdown: under the Retry-After, so a client
// told to come back later does not come back to a closing listener.
const stopLinger = 300 * time.Millisecond

// idleGrace is how long a connection must have been idle before shutdown
// closes it (see connGuard.drain).
const idleGrace = 500 * time.Millisecond

// lingerClose is how long a connection refused by the server (a request
// it cannot parse, headers too large) is read and discarded after the
// answer, its sending half closed, before it is closed: closing a socket
// with unread data resets it, and the client would lose the answer.
const lingerClose = 500 * time.Millisecond

// listener is what Listen opens and Serve serves.
type listener struct {
	ln      *stoppable
	conns   *connGuard
	srv     *fasthttp.Server
	served  chan struct{} // closed when Serve returns
	adapted fasthttp.RequestHandler
	started atomic.Bool // Serve has begun
	once    sync.Once   // guards Shutdown
}

// Listen opens the API's listener on addr (host:port; port 0 picks a free
// one, which Addr tells). Serve serves it.
func (s *Server) Listen(addr string) error {
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	l := &listener{ln: &stoppable{TCPListener: tcp.(*net.TCPListener), log: s.cfg.Logger}, conns: newConnGuard(s.cfg.MaxConns),
		served: make(chan struct{})}
	l.adapted = fasthttpadaptor.NewFastHTTPHandler(adapted(s, s.cfg.Logger))
	l.srv = &fasthttp.Server{
		Handler:        s.serveFast,
		ErrorHandler:   s.refuseRequest,
		HeaderReceived: s.headerReceived,
		ConnState:      l.conns.state,
		// Concurrency is fasthttp's own cap on connections, which answers
		// plain text past it: above the connection guard's, which closes
		// connections past MaxConns first.
		Concurrency:        2*s.cfg.MaxConns + 1024,
		ReadBufferSize:     MaxHeaderBytes,
		ReadTimeout:        ReadHeaderTimeout,
		WriteTimeout:       WriteTimeout,
		IdleTimeout:        s.cfg.IdleTimeout,
		MaxRequestBodySize: maxAdminBody,
		StreamRequestBody:  true,
		// A body is the handler's to read: a multipart one is refused by
		// POST /grab (not JSON), not parsed.
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		Logger:                       slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.listener = l
	return nil
}

// Addr is the listener's address (after Listen).
func (s *Server) Addr() net.Addr { return s.listener.ln.Addr() }

// Connections returns the client connections open, and those closed to
// stay under Config.MaxConns (after Listen).
func (s *Server) Connections() (open int, shed int64) { return s.listener.conns.stats() }

// Serve serves the listener opened by Listen until Shutdown, and returns
// nil then; any other end is an error.
func (s *Server) Serve() error {
	l := s.listener
	l.started.Store(true)
	defer close(l.served)
	if err := l.srv.Serve(lingering{l.ln}); err != nil && !(l.ln.stopping.Load() && errors.Is(err, net.ErrClosed)) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// Shutdown stops the listener, answering every request that reached it;
// steps 2 and 3 of a graceful stop (Drain, the first, comes before it, for
// the drain delay):
//
//  2. grabs are answered 503 with Retry-After before any work (Stop), for
//     stopLinger, so that clients still coming are told to go elsewhere;
//  3. the listener closes, after taking what waits in its backlog; every
//     open connection is answered and closed after its answer, or once idle
//     for idleGrace (never the moment it turns idle, which would race a
//     request on the wire); the server shuts down once every in-flight
//     request is answered: every grab finishes (each is one atomic script:
//     none is left half done).
//
// ctx's deadline bounds it all; Shutdown then returns with what is still
// open left to its timeouts. The worker pool and the shards are the
// caller's to close after it. Without Listen it does nothing; after Listen
// without Serve it closes the listener.
func (s *Server) Shutdown(ctx context.Context) error {
	l := s.listener
	if l == nil {
		return nil
	}
	var err error
	l.once.Do(func() {
		if !l.started.Load() { // nothing served: nothing to answer
			s.Stop()
			err = l.ln.TCPListener.Close()
			return
		}
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(time.Hour)
		}
		s.Stop()
		select {
		case <-time.After(min(stopLinger, time.Until(deadline))):
		case <-ctx.Done():
		}
		l.ln.Stop()
		select {
		case <-l.served: // the backlog taken, the listener closed
		case <-ctx.Done():
		}
		if !l.conns.drain(deadline, idleGrace) {
			s.cfg.Logger.Warn("connections still open at the shutdown timeout", "open", l.conns.openNow())
		}
		if err = l.srv.ShutdownWithContext(ctx); err != nil {
			err = fmt.Errorf("shutdown: %w", err)
		}
	})
	return err
}

// serveFast answers a request on the listener: POST /grab natively, the
// rest through the net/http handler.
func (s *Server) serveFast(ctx *fasthttp.RequestCtx) {
	defer s.recoverFast(ctx)
	h := &ctx.Request.Header
	if h.IsHTTP11() && len(h.Host()) == 0 {
		s.refuseFast(ctx, http.StatusBadRequest, "missing required Host header")
		return
	}
	if isGrab(h) {
		s.fastGrab(ctx)
		return
	}
	if ctx.Request.IsBodyStream() {
		// A body over maxAdminBody, or chunked: read here, bounded, as the
		// adaptor would read it whole.
		_ = ctx.SetReadDeadline(time.Now().Add(ReadTimeout))
		b, err := io.ReadAll(io.LimitReader(ctx.RequestBodyStream(), maxAdminBody+1))
		switch {
		case err != nil:
			s.refuseFast(ctx, http.StatusBadRequest, "reading body: "+err.Error())
			return
		case len(b) > maxAdminBody:
			s.refuseFast(ctx, http.StatusBadRequest, fmt.Sprintf("body is larger than %d bytes", maxAdminBody))
			return
		}
		ctx.Request.SetBody(b)
	}
	if reason := unadaptable(ctx); reason != "" {
		s.refuseFast(ctx, http.StatusBadRequest, reason)
		return
	}
	s.listener.adapted(ctx)
}

// unadaptable is why the adaptor cannot hand a request to a net/http
// handler ("" when it can): a request URI that net/url does not parse
// (a malformed escape, /%zz), which the adaptor would answer 500 in
// plain text.
func unadaptable(ctx *fasthttp.RequestCtx) string {
	if _, err := url.ParseRequestURI(string(ctx.RequestURI())); err != nil {
		return "malformed request URI"
	}
	return ""
}

// recoverFast answers a request whose handling panicked 500, JSON, and
// closes its connection, as the adaptor's routes are answered (see
// adapted): fasthttp does not recover, and a panic would take the process
// down with every grab in flight.
func (s *Server) recoverFast(ctx *fasthttp.RequestCtx) {
	p := recover()
	if p == nil {
		return
	}
	s.cfg.Logger.Error("panic serving a request", "method", string(ctx.Method()), "path", string(ctx.Path()),
		"panic", p, "stack", string(debug.Stack()))
	s.refuseFast(ctx, http.StatusInternalServerError, "internal error")
}

// isGrab says whether a request is POST /grab (a query, if any, aside).
func isGrab(h *fasthttp.RequestHeader) bool {
	if !h.IsPost() {
		return false
	}
	uri := h.RequestURI()
	for i, c := range uri {
		if c == '?' {
			uri = uri[:i]
			break
		}
	}
	return string(uri) == "/grab"
}

// headerReceived sets a request's limits once its headers are in: a grab's
// body is streamed, so that the grab is called as soon as its body's first
// byte is in (within Config.GrabBodyTimeout) and reads the rest under its
// own deadline, answering before the body where the body cannot change the
// answer (see serveGrab); any other request's body is read whole, within
// ReadTimeout.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if isGrab(h) {
		return fasthttp.RequestConfig{ReadTimeout: s.cfg.GrabBodyTimeout, MaxRequestBodySize: 1}
	}
	return fasthttp.RequestConfig{ReadTimeout: ReadTimeout}
}

// fastGrab is POST /grab on the listener, with what serve does for every
// request: the request id, Connection: close once draining, the access
// log.
func (s *Server) fastGrab(ctx *fasthttp.RequestCtx) {
	var buf [64]byte
	id := s.fastRequestID(ctx, buf[:0])
	ctx.Response.Header.SetBytesV("X-Request-Id", id)
	if s.draining.Load() {
		ctx.SetConnectionClose() // see Drain
	}
	start := time.Now()
	s.serveGrab(fastExchange{ctx})
	if s.access.admit(start) {
		s.cfg.Logger.Info("http", "request_id", string(id), "method", "POST", "path", "/grab",
			"status", ctx.Response.StatusCode(), "duration_ms", float64(time.Since(start).Microseconds())/1000,
			"remote", ctx.RemoteAddr().String())
	}
}

// fastRequestID is requestID on the listener, without a string: the
// request's own id (valid while the request is served), or a new one
// appended to dst.
func (s *Server) fastRequestID(ctx *fasthttp.RequestCtx, dst []byte) []byte {
	if v := ctx.Request.Header.PeekAll("X-Request-Id"); len(v) == 1 && saneRequestID(v[0]) {
		return v[0]
	}
	return s.ids.appendNext(dst)
}

// refuseRequest answers a request the listener could not read (the
// server's ErrorHandler) as unread says, in the contract's form
// (refuseFast).
func (s *Server) refuseRequest(ctx *fasthttp.RequestCtx, err error) {
	if code, reason, ok := unread(ctx, err, fmt.Sprintf(
		"its headers within %v, a grab's body within %v of them, any other body within %v",
		ReadHeaderTimeout, s.cfg.GrabBodyTimeout, ReadTimeout)); ok {
		s.refuseFast(ctx, code, reason)
	}
}

// unread is the answer to a request a listener could not read: headers
// over MaxHeaderBytes 431; a request that did not arrive in time (within
// the times given), or that cannot be parsed, 400. ok is false when
// nothing came: a connection idle past its deadline is closed without an
// answer (one would reach a client that sent nothing, and that may send
// its next request meanwhile).
func unread(ctx *fasthttp.RequestCtx, err error, times string) (code int, reason string, ok bool) {
	if c, is := ctx.Conn().(*clientConn); is && c.unanswered.Load() == 0 {
		_ = c.TCPConn.Close()
		return 0, "", false
	}
	var small *fasthttp.ErrSmallBuffer
	code, reason = http.StatusBadRequest, "malformed HTTP request"
	switch {
	case errors.As(err, &small):
		code, reason = http.StatusRequestHeaderFieldsTooLarge, fmt.Sprintf("request header fields larger than %d bytes", MaxHeaderBytes)
	case errors.Is(err, os.ErrDeadlineExceeded):
		reason = "the request did not arrive in time (" + times + ")"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		reason = fmt.Sprintf("body is larger than %d bytes", maxAdminBody)
	}
	return code, reason, true
}

// refuseFast answers code with the reason, as the server's own answers
// are: status invalid (a 5xx: error), and the connection closed after it,
// lingering (what is left of the request may still be on its way). A
// grab's answer (or one to a request whose path is unknown: "/") has the
// contract's form, always with pool_id and user_id (API.md; empty here:
// the body was not read), and a grab is never answered 500: an error of
// this instance is 503 overloaded, its outcome not known, Retry-After 1.
func (s *Server) refuseFast(ctx *fasthttp.RequestCtx, code int, reason string) {
	// A request whose line could not be read has the path "/".
	refuseJSON(ctx, code, reason, string(ctx.Path()) == "/grab" || string(ctx.Path()) == "/")
}

// refuseJSON is refuseFast, the contract's form of a grab's answer used
// when grabbing.
func refuseJSON(ctx *fasthttp.RequestCtx, code int, reason string, grabbing bool) {
	st := "invalid"
	if code >= 500 {
		st = "error"
	}
	ctx.Response.Reset()
	x := fastExchange{ctx: ctx}
	x.closeAfter()
	body := map[string]string{"status": st, "error": reason}
	if grabbing {
		body["pool_id"], body["user_id"] = "", ""
		if code == http.StatusInternalServerError {
			code, body["status"], body["error"] = stOverloaded.code(), stOverloaded.String(), rsInternal.text()
			x.setHeader("Retry-After", "1")
		}
	}
	replyJSON(x, code, body)
}

// adapted is h as the adaptor runs it, as net/http would: its request's
// context ends once the handler returns (the adaptor's would last until
// the listener shuts down, and so would whatever a handler started with
// it), and a handler that panics is answered 500, JSON (the adaptor would
// take the process down); and every answer net/http's own code writes
// (a redirect, a refusal in plain text) is JSON (jsonOnly).
func adapted(h http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		r = r.WithContext(ctx)
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				log.Error("panic serving a request", "method", r.Method, "path", r.URL.Path, "panic", p)
				writeJSON(w, http.StatusInternalServerError, map[string]string{"status": "error", "error": "internal error"})
			}
		}()
		jw := &jsonOnly{ResponseWriter: w}
		h.ServeHTTP(jw, r)
		jw.finish()
	})
}

// lingering hands out the listener's connections (see clientConn).
type lingering struct{ *stoppable }

func (l lingering) Accept() (net.Conn, error) {
	c, err := l.stoppable.Accept()
	if err != nil {
		return nil, err
	}
	return &clientConn{TCPConn: c.(*net.TCPConn)}, nil
}

// clientConn is a client's connection to the listener. It knows whether
// a request has begun on it since its last answer (the server's error
// handler answers a request cut short, and closes a connection that only
// idled past its deadline without a word, as net/http does), and lingers
// before it closes when an answer closed it, the request perhaps not read
// to its end (see lingerClose).
type clientConn struct {
	*net.TCPConn
	unanswered atomic.Int64 // bytes read since the last write
	linger     atomic.Bool  // set when the server closes it after an answer (closeAfter)
}

func (c *clientConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	c.unanswered.Add(int64(n))
	return n, err
}

func (c *clientConn) Write(p []byte) (int, error) {
	c.unanswered.Store(0)
	return c.TCPConn.Write(p)
}

func (c *clientConn) Close() error {
	if c.linger.Load() {
		_ = c.CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(lingerClose))
		_, _ = io.Copy(io.Discard, c.TCPConn)
	}
	return c.TCPConn.Close()
}
