package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"rain"
)

// runFixed is `rainload fixed`: a server that answers every valid POST /grab with
// the same 200 granted, doing no other work, so that a load test against it
// measures the driver's own ceiling on this machine (-server bare, the
// default), or what an HTTP server alone costs per request (-server net/http
// or fasthttp: the floors of scripts/bench.sh budget). It stops on ctx.
func runFixed(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("rainload fixed", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8090", "listen `address`")
	server := fs.String("server", "bare", "the HTTP server: `bare` (its own minimal HTTP/1.1, the driver's ceiling), "+
		"net/http or fasthttp (each with rain's limits on requests; the same answers)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	serve, ok := fixedServers[*server]
	if !ok {
		return fmt.Errorf("-server %q: want bare, net/http or fasthttp", *server)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "rainload fixed: %s listening on %s\n", *server, ln.Addr())
	return serve(newFixed(), ctx, ln)
}

// fixedServers are the servers of rainload fixed -server, by name. Each
// serves on ln until ctx is done, answers with fixed.grab, and returns nil
// once stopped.
var fixedServers = map[string]func(f *fixed, ctx context.Context, ln net.Listener) error{
	"bare":     (*fixed).serve,
	"net/http": (*fixed).serveNetHTTP,
	"fasthttp": (*fixed).serveFastHTTP,
}

// fixed is the fixed-answer server. It speaks just enough HTTP/1.1 for POST /grab
// and GET /healthz over keep-alive connections, one goroutine per connection.
// It is not net/http on purpose: the driver and the server share the machine's
// cores, and net/http's server costs about as much CPU per request as the driver
// itself, which would halve the ceiling measured and say little about the driver.
// A grab body is still decoded with encoding/json (unknown fields refused, ids
// checked as docs/api.md says) and answered 200 {"status":"granted",...} with amount
// 1 and a counting serial; a bad one 400 invalid.
type fixed struct {
	serial atomic.Int64
	wg     sync.WaitGroup // one per connection goroutine

	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
}

func newFixed() *fixed { return &fixed{conns: map[net.Conn]struct{}{}} }

// serve accepts connections on ln until ctx is done, then closes ln and every
// connection, waits for their goroutines and returns nil.
func (f *fixed) serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		f.mu.Lock()
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
	})
	defer stop()
	defer f.wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		f.mu.Lock()
		if ctx.Err() != nil { // the AfterFunc already ran: it will not see c
			f.mu.Unlock()
			c.Close()
			return nil
		}
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Go(func() {
			f.handle(c)
			f.mu.Lock()
			delete(f.conns, c)
			f.mu.Unlock()
			c.Close()
		})
	}
}

// maxRequest bounds a request's body (docs/api.md's 4 KiB).
const maxRequest = 4 << 10

// handle serves requests on c until it closes or sends something that is not a
// request handle knows.
func (f *fixed) handle(c net.Conn) {
	br := bufio.NewReaderSize(c, 4<<10)
	bw := bufio.NewWriterSize(c, 4<<10)
	body := make([]byte, maxRequest)
	var out []byte
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return
		}
		method, rest, _ := bytes.Cut(line, []byte(" "))
		path, _, _ := bytes.Cut(rest, []byte(" "))
		route := string(method) + " " + string(path)
		length, keep := 0, true
		for {
			h, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			h = bytes.TrimRight(h, "\r\n")
			if len(h) == 0 {
				break
			}
			name, value, _ := bytes.Cut(h, []byte(":"))
			value = bytes.TrimSpace(value)
			switch {
			case asciiEqualFold(name, "content-length"):
				if length, err = strconv.Atoi(string(value)); err != nil || length < 0 {
					return
				}
			case asciiEqualFold(name, "transfer-encoding"):
				return // no client of rain sends chunked requests
			case asciiEqualFold(name, "connection"):
				keep = !asciiEqualFold(value, "close")
			}
		}
		if length > maxRequest {
			f.reply(bw, 413, `{"status":"invalid","error":"body too large"}`, false)
			return
		}
		if _, err := io.ReadFull(br, body[:length]); err != nil {
			return
		}
		switch route {
		case "POST /grab":
			var ok bool
			out, ok = f.grab(out[:0], body[:length])
			code := 200
			if !ok {
				code = 400
			}
			err = f.reply(bw, code, string(out), keep)
		case "GET /healthz":
			err = f.reply(bw, 200, `{"status":"ok"}`, keep)
		default:
			err = f.reply(bw, 404, `{"error":"not found"}`, keep)
		}
		if err != nil || !keep {
			return
		}
	}
}

// grab appends the answer to a grab request body to b, and reports whether the
// body was valid.
func (f *fixed) grab(b, body []byte) ([]byte, bool) {
	var req struct {
		PoolID string `json:"pool_id"`
		UserID string `json:"user_id"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || !rain.ValidID(req.PoolID) || !rain.ValidID(req.UserID) {
		return append(b, `{"status":"invalid","error":"bad grab body"}`...), false
	}
	// The ids were checked to need no JSON escaping.
	b = append(b, `{"status":"granted","pool_id":"`...)
	b = append(b, req.PoolID...)
	b = append(b, `","user_id":"`...)
	b = append(b, req.UserID...)
	b = append(b, `","amount_cents":1,"serial":`...)
	b = strconv.AppendInt(b, f.serial.Add(1), 10)
	b = append(b, `,"expires_at":"2030-01-01T00:00:00Z"}`...)
	return b, true
}

var reasons = map[int]string{200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Request Entity Too Large"}

// reply writes and flushes one response.
func (f *fixed) reply(bw *bufio.Writer, code int, body string, keep bool) error {
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(code))
	bw.WriteString(" ")
	bw.WriteString(reasons[code])
	bw.WriteString("\r\nContent-Type: application/json\r\nContent-Length: ")
	bw.WriteString(strconv.Itoa(len(body)))
	if !keep {
		bw.WriteString("\r\nConnection: close")
	}
	bw.WriteString("\r\n\r\n")
	bw.WriteString(body)
	return bw.Flush()
}
