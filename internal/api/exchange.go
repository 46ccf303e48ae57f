package api

// This file is what POST /grab needs of the server that carries it: the
// listener's (Serve, the production path) or net/http's (ServeHTTP, for a
// server of one's own). grab.go is written once against exchange.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"
)

// exchange is one grab's request and its answer.
type exchange interface {
	// header is the request header's (first) value, lastHeader its last
	// one (a header a chain of proxies appends to).
	header(name string) string
	lastHeader(name string) string
	// jsonBody says whether the request's Content-Type is
	// application/json (see isJSON).
	jsonBody() bool
	// context is the grab's: on net/http it ends when the client goes
	// away. On the listener it never ends: nothing watches the connection
	// while a grab runs, so a grab whose client left is run and answered
	// (the client gets its grant back by retrying, already_granted), and
	// what bounds the grab is the budget of each call it makes (its
	// claim's: the shard's call budget).
	context() context.Context
	// remoteAddr is the peer's address, host:port.
	remoteAddr() string
	// body is the request body; setReadDeadline bounds the wait for it
	// (the zero time lifts the bound).
	body() io.Reader
	setReadDeadline(t time.Time)
	// closeAfter closes the connection after the answer.
	closeAfter()
	setHeader(name, value string)
	// reply answers code with the JSON body b.
	reply(code int, b []byte)
}

// replyJSON answers code with v in JSON, as writeJSON does.
func replyJSON(x exchange, code int, v any) {
	b, _ := json.Marshal(v)
	x.reply(code, append(b, '\n'))
}

// httpExchange is a grab on net/http.
type httpExchange struct {
	w http.ResponseWriter
	r *http.Request
}

func (x httpExchange) header(name string) string { return x.r.Header.Get(name) }

func (x httpExchange) lastHeader(name string) string {
	v := x.r.Header.Values(name)
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func (x httpExchange) jsonBody() bool           { return isJSON(x.r.Header.Get("Content-Type")) }
func (x httpExchange) context() context.Context { return x.r.Context() }
func (x httpExchange) remoteAddr() string       { return x.r.RemoteAddr }
func (x httpExchange) body() io.Reader          { return x.r.Body }

func (x httpExchange) setReadDeadline(t time.Time) {
	_ = http.NewResponseController(x.w).SetReadDeadline(t)
}

func (x httpExchange) closeAfter()                  { x.w.Header().Set("Connection", "close") }
func (x httpExchange) setHeader(name, value string) { x.w.Header().Set(name, value) }

func (x httpExchange) reply(code int, b []byte) {
	x.w.Header().Set("Content-Type", "application/json")
	x.w.WriteHeader(code)
	_, _ = x.w.Write(b)
}

// fastExchange is a grab on the listener. Its body is streamed (see
// Server.headerReceived): the grab is called once the body's first byte
// is in, and reads the rest under its own deadline.
type fastExchange struct {
	ctx *fasthttp.RequestCtx
}

func (x fastExchange) header(name string) string {
	return string(x.ctx.Request.Header.Peek(name))
}

func (x fastExchange) lastHeader(name string) string {
	v := x.ctx.Request.Header.PeekAll(name)
	if len(v) == 0 {
		return ""
	}
	return string(v[len(v)-1])
}

// jsonBody is isJSONBytes of the request's Content-Type.
func (x fastExchange) jsonBody() bool {
	return isJSONBytes(x.ctx.Request.Header.Peek("Content-Type"))
}

func (x fastExchange) context() context.Context { return context.Background() }
func (x fastExchange) remoteAddr() string       { return x.ctx.RemoteAddr().String() }

func (x fastExchange) body() io.Reader {
	if s := x.ctx.RequestBodyStream(); s != nil {
		return s
	}
	return bytes.NewReader(x.ctx.PostBody())
}

func (x fastExchange) setReadDeadline(t time.Time) { _ = x.ctx.SetReadDeadline(t) }

// closeAfter closes the connection after the answer, lingering (see
// clientConn).
func (x fastExchange) closeAfter() {
	x.ctx.SetConnectionClose()
	if c, ok := x.ctx.Conn().(*clientConn); ok {
		c.linger.Store(true)
	}
}

func (x fastExchange) setHeader(name, value string) { x.ctx.Response.Header.Set(name, value) }

func (x fastExchange) reply(code int, b []byte) {
	x.ctx.SetStatusCode(code)
	x.ctx.SetContentType("application/json")
	_, _ = x.ctx.Write(b)
}
