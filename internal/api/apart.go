package api

// This file serves a handler on a listener of its own with the API
// listener's limits and refusals (rain serve's --admin-listen,
// --metrics-listen and --debug-listen, rain settle's health listener):
// a request the server cannot read is answered as the API's listener
// answers it, JSON (API.md: every answer is), and none of them can be
// held open by a client that sends slowly, reads slowly or idles.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

// ServeApart serves h on ln in the background until stop, which shuts it
// down (waiting up to 5 s for requests in flight). A request's headers
// come within ReadHeaderTimeout and hold at most MaxHeaderBytes, its body
// (at most maxAdminBody) within ReadTimeout; its answer is written within write,
// and an idle connection is closed after idle. h runs as the API's
// listener runs its routes other than POST /grab: a panic is answered
// 500, JSON, and the request's context ends once h returns.
func ServeApart(ln net.Listener, h http.Handler, write, idle time.Duration, log *slog.Logger) (stop func()) {
	adapted := fasthttpadaptor.NewFastHTTPHandler(adapted(h, log))
	times := fmt.Sprintf("its headers within %v, its body within %v", ReadHeaderTimeout, ReadTimeout)
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if ctx.Request.Header.IsHTTP11() && len(ctx.Request.Header.Host()) == 0 {
				refuseJSON(ctx, http.StatusBadRequest, "missing required Host header", false)
				return
			}
			if reason := unadaptable(ctx); reason != "" {
				refuseJSON(ctx, http.StatusBadRequest, reason, false)
				return
			}
			adapted(ctx)
		},
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			if code, reason, ok := unread(ctx, err, times); ok {
				refuseJSON(ctx, code, reason, false)
			}
		},
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: ReadTimeout}
		},
		ReadBufferSize:               MaxHeaderBytes,
		ReadTimeout:                  ReadHeaderTimeout,
		WriteTimeout:                 write,
		IdleTimeout:                  idle,
		MaxRequestBodySize:           maxAdminBody,
		DisablePreParseMultipartForm: true,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		Logger:                       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(apartListener{ln}) }()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
		// A Shutdown that came before Serve began found no listener to
		// close: closed here, Serve then returns at its first Accept.
		_ = ln.Close()
		<-done
	}
}

// apartListener hands out its connections as the API's listener does (see
// clientConn): the error handler can tell a request cut short from a
// connection that only idled, and a connection closed after a refusal
// lingers for the rest of its request.
type apartListener struct{ net.Listener }

func (l apartListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &clientConn{TCPConn: tc}, nil
	}
	return c, nil
}
