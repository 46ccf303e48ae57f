package main

// This file is rainload fixed on net/http and on fasthttp: the same
// answers as the bare server (fixed.grab), through a general HTTP server,
// so that what an HTTP layer alone costs per request can be measured
// beside rain (scripts/bench.sh budget: the floors). Both run with the
// limits rain's own listener has (cmd/rain: headers within 5 s, the
// request within 10 s, the answer within 30 s, 30 s idle, 16 KiB of
// headers), since each limit costs a deadline per request.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

const (
	fixedMaxHeader   = 16 << 10
	fixedReadHeader  = 5 * time.Second
	fixedRead        = 10 * time.Second
	fixedWrite       = 30 * time.Second
	fixedIdle        = 30 * time.Second
	fixedStopTimeout = 5 * time.Second
)

// fixedBuf is a request's body and its answer, reused through fixedBufs.
type fixedBuf struct{ body, out []byte }

var fixedBufs = sync.Pool{New: func() any { return &fixedBuf{body: make([]byte, 0, maxRequest)} }}

// serveNetHTTP serves f's answers with net/http on ln until ctx is done,
// then shuts the server down (in-flight requests get fixedStopTimeout) and
// returns nil.
func (f *fixed) serveNetHTTP(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /grab", func(w http.ResponseWriter, r *http.Request) {
		b := fixedBufs.Get().(*fixedBuf)
		defer fixedBufs.Put(b)
		var err error
		b.body, err = readAllInto(b.body[:0], http.MaxBytesReader(w, r.Body, maxRequest))
		if err != nil {
			code, msg := http.StatusBadRequest, `{"status":"invalid","error":"bad grab body"}`
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				code, msg = http.StatusRequestEntityTooLarge, `{"status":"invalid","error":"body too large"}`
			}
			writeFixed(w, code, []byte(msg))
			return
		}
		var ok bool
		b.out, ok = f.grab(b.out[:0], b.body)
		code := http.StatusOK
		if !ok {
			code = http.StatusBadRequest
		}
		writeFixed(w, code, b.out)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeFixed(w, http.StatusOK, []byte(`{"status":"ok"}`))
	})
	srv := &http.Server{
		Handler:           mux,
		MaxHeaderBytes:    fixedMaxHeader,
		ReadHeaderTimeout: fixedReadHeader,
		ReadTimeout:       fixedRead,
		WriteTimeout:      fixedWrite,
		IdleTimeout:       fixedIdle,
	}
	return serveUntil(ctx, func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}, func(sctx context.Context) error {
		if err := srv.Shutdown(sctx); err != nil {
			srv.Close() // the requests still running after the timeout
		}
		return nil
	})
}

// serveUntil runs serve until it fails or ctx ends; then it stops the
// server by shutdown, given fixedStopTimeout, and returns serve's error,
// else shutdown's (requests still running at the timeout are no error: the
// process is ending).
func serveUntil(ctx context.Context, serve func() error, shutdown func(context.Context) error) error {
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), fixedStopTimeout)
	defer cancel()
	err := shutdown(sctx)
	if serr := <-errc; serr != nil {
		return serr
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// writeFixed writes one answer with its length (so net/http sends it
// whole, not chunked).
func writeFixed(w http.ResponseWriter, code int, body []byte) {
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// readAllInto appends what r holds to b until EOF.
func readAllInto(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// serveFastHTTP serves f's answers with fasthttp on ln until ctx is done,
// then shuts the server down (idle connections closed, in-flight requests
// get fixedStopTimeout) and returns nil.
func (f *fixed) serveFastHTTP(ctx context.Context, ln net.Listener) error {
	srv := &fasthttp.Server{
		Handler: func(rc *fasthttp.RequestCtx) {
			rc.SetContentType("application/json")
			switch path := rc.Path(); {
			case string(path) == "/grab" && rc.IsPost():
				b := fixedBufs.Get().(*fixedBuf)
				defer fixedBufs.Put(b)
				var ok bool
				b.out, ok = f.grab(b.out[:0], rc.PostBody())
				if !ok {
					rc.SetStatusCode(fasthttp.StatusBadRequest)
				}
				rc.SetBody(b.out) // copied: b goes back to the pool
			case string(path) == "/healthz" && rc.IsGet():
				rc.SetBodyString(`{"status":"ok"}`)
			default:
				rc.SetStatusCode(fasthttp.StatusNotFound)
				rc.SetBodyString(`{"error":"not found"}`)
			}
		},
		// A body over the limit, or a request fasthttp cannot parse, is
		// answered 413 or 400 as the other servers answer it, then closed.
		ErrorHandler: func(rc *fasthttp.RequestCtx, err error) {
			rc.SetContentType("application/json")
			if errors.Is(err, fasthttp.ErrBodyTooLarge) {
				rc.SetStatusCode(fasthttp.StatusRequestEntityTooLarge)
				rc.SetBodyString(`{"status":"invalid","error":"body too large"}`)
				return
			}
			rc.SetStatusCode(fasthttp.StatusBadRequest)
			rc.SetBodyString(`{"status":"invalid","error":"bad request"}`)
		},
		Logger:                quiet{}, // a client that goes away is no news
		MaxRequestBodySize:    maxRequest,
		ReadBufferSize:        fixedMaxHeader,
		ReadTimeout:           fixedRead,
		WriteTimeout:          fixedWrite,
		IdleTimeout:           fixedIdle,
		NoDefaultServerHeader: true,
	}
	return serveUntil(ctx, func() error { return srv.Serve(ln) }, srv.ShutdownWithContext)
}

// quiet is a fasthttp.Logger that logs nothing.
type quiet struct{}

func (quiet) Printf(string, ...any) {}
